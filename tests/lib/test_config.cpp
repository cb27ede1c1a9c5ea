// Config validation: every rule rejects its bad value with a message naming the field.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

#include "tinygpt/config.h"

namespace tinygpt {
namespace {

void expect_rejected(const std::function<void(Config&)>& edit, const std::string& field) {
  Config c;
  edit(c);
  try {
    c.validate();
    FAIL() << "accepted a config with a bad " << field;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(Config, DefaultIsValid) { EXPECT_NO_THROW(Config{}.validate()); }

TEST(Config, RejectsTinyVocab) { expect_rejected([](Config& c) { c.vocab_size = 1; }, "vocab_size"); }
TEST(Config, RejectsTinyDModel) { expect_rejected([](Config& c) { c.d_model = 0; }, "d_model"); }
TEST(Config, RejectsZeroHeads) { expect_rejected([](Config& c) { c.n_heads = 0; }, "n_heads"); }
TEST(Config, RejectsIndivisibleDModel) {
  expect_rejected([](Config& c) { c.n_heads = 3; }, "d_model");
}
TEST(Config, RejectsOddHeadDim) {
  expect_rejected([](Config& c) { c.d_model = 12; c.n_heads = 4; }, "n_heads");
}
TEST(Config, RejectsZeroLayers) { expect_rejected([](Config& c) { c.n_layers = 0; }, "n_layers"); }
TEST(Config, RejectsZeroContext) { expect_rejected([](Config& c) { c.context = 0; }, "context"); }
TEST(Config, RejectsDropoutOutOfRange) {
  expect_rejected([](Config& c) { c.dropout = 1.0; }, "dropout");
  expect_rejected([](Config& c) { c.dropout = -0.1; }, "dropout");
}

}  // namespace
}  // namespace tinygpt
