// The equivalence harness and the fault matrix: the correct cache passes every check, every
// fault is caught by at least one, and a cache wrong at ONE step is named at that step.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "equivalence.h"
#include "inject.h"
#include "report.h"

namespace tinygpt::checks {
namespace {

// A small model keeps the full fault matrix fast; its context is short so 2.5 windows are cheap.
Config small_config() {
  Config c;
  c.vocab_size = 256;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_layers = 2;
  c.context = 32;
  return c;
}

class Harness : public ::testing::Test {
 protected:
  void SetUp() override { model->eval(); }
  GPT model{small_config(), 11};
  EquivalenceOptions opts{at::tensor({1, 2, 3}, at::kLong).unsqueeze(0), 80};
};

TEST_F(Harness, RollingCachePassesEveryCheck) {
  const auto ref = build_reference(model, opts);
  const auto r = check_equivalence(model, opts, ref, cache_registry().get("rolling"));
  EXPECT_TRUE(r.passed()) << format_equivalence(r);
  EXPECT_EQ(r.must_match, 29);
  EXPECT_GE(r.identical_prefix, 29);
  EXPECT_LT(r.worst_window_diff, 1e-5);
  EXPECT_NE(format_equivalence(r).find("first 29 tokens identical with and without the cache"), std::string::npos);
}

TEST_F(Harness, EveryFaultIsCaughtAndTheControlPasses) {
  const auto faults = cache_registry().all(/*faults=*/true);
  ASSERT_GE(faults.size(), 8u);
  const auto rep = run_injection(model, opts, faults, /*drift_tokens=*/40);
  EXPECT_TRUE(rep.control.passed()) << format_equivalence(rep.control);
  for (const auto& f : rep.faults) EXPECT_TRUE(f.caught()) << f.fault << " was missed by every check";
  EXPECT_TRUE(rep.passed()) << format_injection(rep);
  // Faults that only matter past the window must still be caught, by the window reference.
  for (const auto& f : rep.faults)
    if (f.fault == "never-trimmed" || f.fault == "trim-before-attend") {
      EXPECT_TRUE(f.checks[1].passed) << f.fault << " should be invisible inside the window";
      EXPECT_FALSE(f.checks[2].passed) << f.fault;
    }
}

// A cache that is wrong at exactly one decode step: on the step that brings it to `bad_len`
// entries, the LAST layer's newest value comes back scaled. Only the last layer, so no stored
// entry is affected and every other step stays exact.
class OneBadStep final : public KVCache {
 public:
  OneBadStep(const Config& c, int64_t bad_len) : inner_(c), last_layer_(c.n_layers - 1), bad_len_(bad_len) {}
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override {
    auto kv = inner_.update(layer, k, v);
    if (layer == last_layer_ && kv.second.size(2) == bad_len_ && k.size(2) == 1) {
      at::Tensor V = kv.second.clone();
      V.narrow(2, bad_len_ - 1, 1).mul_(50.0);
      return {kv.first, V};
    }
    return kv;
  }
  void reset() override { inner_.reset(); }
  int64_t length() const override { return inner_.length(); }
  int64_t bytes() const override { return inner_.bytes(); }

 private:
  RollingKVCache inner_;
  int64_t last_layer_, bad_len_;
};

TEST_F(Harness, ACacheWrongAtOneStepIsNamedAtThatStep) {
  const int64_t bad_len = 11;  // the step feeding position 10
  CacheVariant bad{"one-bad-step", "test double",
                   [bad_len](const Config& c) { return std::make_unique<OneBadStep>(c, bad_len); },
                   std::shared_ptr<const AttentionPolicy>(&production_policy(), [](const AttentionPolicy*) {}), true};
  const auto ref = build_reference(model, opts);
  const auto r = check_equivalence(model, opts, ref, bad);
  EXPECT_FALSE(r.passed());
  ASSERT_TRUE(r.first_window_step_over.has_value());
  EXPECT_EQ(*r.first_window_step_over, bad_len - 1);
  // Every other in-window step stays within tolerance: the harness localises the fault.
  for (size_t i = 0; i < r.window_diffs.size(); ++i)
    if (static_cast<int64_t>(i) + r.prompt_len - 1 != bad_len - 1) {
      EXPECT_LT(r.window_diffs[i], r.tolerance) << i;
    }
  const std::string text = format_equivalence(r);
  EXPECT_NE(text.find("first at position 10 (step 8, |diff| "), std::string::npos) << text;
  EXPECT_NE(text.find("top-2 margin there"), std::string::npos) << text;
  ASSERT_EQ(r.step_margins.size(), 80u);
  EXPECT_GE(r.step_margins[8], 0.0);
}

TEST_F(Harness, JsonReportCarriesTheVerdictAndTheFigures) {
  const auto ref = build_reference(model, opts);
  const auto j = to_json(check_equivalence(model, opts, ref, cache_registry().get("topleft-mask")));
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["cache"], "topleft-mask");
  EXPECT_GT(j["logits"]["worst_diff"].get<double>(), 1e-3);
  EXPECT_EQ(j["checks"].size(), 4u);
}

TEST_F(Harness, RejectsAPromptLongerThanTheContext) {
  EquivalenceOptions too_long{at::ones({1, 40}, at::kLong), 5};
  EXPECT_THROW(build_reference(model, too_long), std::invalid_argument);
}

TEST(CacheRegistry, UnknownNameListsTheKnownOnes) {
  try {
    cache_registry().get("nope");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rope-offset"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tinygpt::checks
