// Sampler argument checking: every bad argument is refused with a message, never clamped.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "tinygpt/sampler.h"

namespace tinygpt {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

void expect_refused(const SamplingSettings& s, const std::string& word) {
  try {
    pick(at::zeros({1, 4}), s);
    FAIL() << "accepted " << s.to_string();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
  }
}

TEST(SamplerArguments, RefusesBadSettings) {
  expect_refused({-0.1, 0, 1.0, 1.0}, "temperature");
  expect_refused({kNaN, 0, 1.0, 1.0}, "temperature");
  expect_refused({1.0, -1, 1.0, 1.0}, "top_k");
  expect_refused({1.0, 5, 1.0, 1.0}, "top_k");  // k > V
  expect_refused({1.0, 0, 0.0, 1.0}, "top_p");
  expect_refused({1.0, 0, 1.5, 1.0}, "top_p");
  expect_refused({1.0, 0, kNaN, 1.0}, "top_p");
  expect_refused({1.0, 0, 1.0, 0.0}, "penalty");
  expect_refused({1.0, 0, 1.0, kNaN}, "penalty");
}

TEST(SamplerArguments, RefusesBadTensors) {
  const SamplingSettings s;
  EXPECT_THROW(pick(at::zeros({4}), s), std::invalid_argument);                      // not 2-D
  EXPECT_THROW(pick(at::zeros({1, 4}, at::kLong), s), std::invalid_argument);        // not floating
  EXPECT_THROW(pick(at::full({1, 4}, kNaN), s), std::invalid_argument);              // NaN
  EXPECT_THROW(pick(at::full({1, 2}, -std::numeric_limits<float>::infinity()), s), std::invalid_argument);
  EXPECT_THROW(pick(at::zeros({1, 4}), s, at::full({1, 2}, 4, at::kLong)), std::invalid_argument);  // id >= V
  EXPECT_THROW(pick(at::zeros({1, 4}), s, at::full({1, 2}, -1, at::kLong)), std::invalid_argument);
  EXPECT_THROW(pick(at::zeros({2, 4}), s, at::zeros({3, 2}, at::kLong)), std::invalid_argument);  // B differs
}

TEST(SamplerArguments, AcceptsHalfPrecisionLogits) {
  at::Tensor x = at::tensor({0.0f, 3.0f, 1.0f}).unsqueeze(0).to(at::kHalf);
  EXPECT_EQ(pick(x, {0.0, 0, 1.0, 1.0}).item<int64_t>(), 1);
}

TEST(SamplerStages, DoNotMutateTheirInput) {
  at::Tensor x = at::tensor({1.0f, -2.0f, 3.0f}).unsqueeze(0);
  at::Tensor copy = x.clone();
  apply_penalty(x, at::tensor({0, 1}, at::kLong).unsqueeze(0), 2.0);
  apply_temperature(x, 0.5);
  apply_top_k(x, 1);
  apply_top_p(x, 0.1);
  EXPECT_TRUE(x.equal(copy));
}

// The stage order of SPEC 6 on hand-computed numbers.
TEST(SamplerStages, PenaltyPushesBothSignsDown) {
  at::Tensor x = at::tensor({2.0f, -2.0f, 1.0f}).unsqueeze(0);
  at::Tensor h = at::tensor({0, 1, 1}, at::kLong).unsqueeze(0);
  at::Tensor y = apply_penalty(x, h, 2.0);
  EXPECT_TRUE(y.equal(at::tensor({1.0f, -4.0f, 1.0f}).unsqueeze(0))) << y;
}

TEST(SamplerStages, TopPBoundaryDropsTheTokenWhoseAboveMassReachesP) {
  // p = [0.5, 0.25, 0.25]: above masses 0, 0.5, 0.75. top_p = 0.5 keeps only token 0.
  at::Tensor x = at::tensor({0.5f, 0.25f, 0.25f}).log().unsqueeze(0);
  at::Tensor f = apply_top_p(x, 0.5);
  EXPECT_TRUE(std::isfinite(f[0][0].item<float>()));
  EXPECT_TRUE(std::isinf(f[0][1].item<float>()));
  EXPECT_TRUE(std::isinf(f[0][2].item<float>()));
}

// SPEC 6.5: torch::manual_seed(s) + our pick reproduce Python's torch.manual_seed(s) + the seed's
// pick on identical logits. Debian's python3-torch is the independent implementation.
TEST(SamplerSeeding, SameDrawsAsPythonPick) {
  const char* script =
      "/usr/bin/python3 -c \""
      "import torch\n"
      "torch.manual_seed(1)\n"
      "x = torch.tensor([[0.5, 1.0, -0.3, 2.0, 0.1, 1.5]]).repeat(4, 1)\n"
      "ids = [torch.multinomial((x / 0.8).softmax(-1), 1)[:, 0] for _ in range(5)]\n"
      "print(','.join(str(int(i)) for t in ids for i in t))\" 2>/dev/null";
  FILE* f = popen(script, "r");
  ASSERT_NE(f, nullptr);
  char buf[512] = {0};
  const bool got = fgets(buf, sizeof buf, f) != nullptr;
  const int rc = pclose(f);
  if (!got || rc != 0) GTEST_SKIP() << "python3-torch not available: install it with ci/install.sh";
  at::manual_seed(1);
  at::Tensor x = at::tensor({0.5f, 1.0f, -0.3f, 2.0f, 0.1f, 1.5f}).unsqueeze(0).repeat({4, 1});
  std::string ours;
  for (int i = 0; i < 5; ++i) {
    at::Tensor ids = pick(x, {0.8, 0, 1.0, 1.0});
    for (int64_t b = 0; b < 4; ++b) ours += (ours.empty() ? "" : ",") + std::to_string(ids[b].item<int64_t>());
  }
  std::string theirs(buf);
  while (!theirs.empty() && (theirs.back() == '\n' || theirs.back() == '\r')) theirs.pop_back();
  EXPECT_EQ(ours, theirs);
}

}  // namespace
}  // namespace tinygpt
