// The one judge (judge.h): a bound the user sets means the same on every row. Every row judged against
// our reference model runs on a fault planted to fail it, under --max-kl and under --min-top1: each
// reports the bound that was set, and that bound - not the fp32 |diff| bound it replaced - decides the
// verdict (a loose one passes the fault, a tight one fails it).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../small_model.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/churn.h"
#include "tinygpt/checks/judge.h"

namespace tinygpt::checks {
namespace {

EquivalenceOptions small_options() {
  EquivalenceOptions o;
  o.prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  o.tokens = 80;
  return o;
}

CheckResult run_row(GPT& model, const CheckDef& row, const CacheVariant& fault, const Tolerances& t) {
  EquivalenceOptions o = small_options();
  o.tolerance = t;
  ModelTarget target(model, fault);
  return run_checks(model, o, target, {row.name}).checks.at(0);
}

// A registered fault that fails `row` by the numbers at the fp32 bound (its largest |diff| over it: a
// fault caught by a contract - the history a sampler is handed - fails whatever the bound) and still
// completes the row's run under a loose bound (a fault may also corrupt a row so far that a later
// operation is refused: an error, whatever the bound); the faults that must be caught by the row first.
// nullptr when none is.
const CacheVariant* fault_for(GPT& model, const CheckDef& row) {
  std::vector<const CacheVariant*> order;
  for (bool expected : {true, false})
    for (const CacheVariant* f : cache_registry().all(/*faults=*/true))
      if (!f->kv_budget && (std::find(f->expected.begin(), f->expected.end(), row.name) != f->expected.end()) == expected)
        order.push_back(f);
  Tolerances loose;
  loose.max_kl = 1e30;
  for (const CacheVariant* f : order) {
    const CheckResult r = run_row(model, row, *f, Tolerances{});
    const auto worst = r.stats.find("max_abs_diff");
    if (r.status != Status::Fail || (worst != r.stats.end() && !(worst->second > kLogitTolerance))) continue;
    if (run_row(model, row, *f, loose).status != Status::Error) return f;
  }
  return nullptr;
}

TEST(Judge, TheDiffBoundByDefaultTheDistributionsWhenSet) {
  StepDiffs d;
  d.first_position = 10;
  d.diffs = {1e-6, 3e-4, 1e-6};
  d.kl = {1e-9, 4e-6, 1e-9};
  d.top1 = {true, false, true};
  d.first_top1_parting = 11;
  const Verdict fp32 = judge(d, Tolerances{});
  EXPECT_FALSE(fp32.ok);
  EXPECT_EQ(fp32.bound, "max |diff| <= 1.00e-04");
  ASSERT_TRUE(fp32.first_over);
  EXPECT_EQ(*fp32.first_over, 1u);
  EXPECT_NE(fp32.why.find("position 11"), std::string::npos) << fp32.why;
  Tolerances kl;
  kl.max_kl = 2e-6;  // the mean (1.3e-6) is inside; step 1 alone is over: where the drift starts
  const Verdict by_kl = judge(d, kl);
  EXPECT_TRUE(by_kl.ok) << by_kl.why;
  EXPECT_EQ(by_kl.bound, "mean KL <= 2.00e-06");
  ASSERT_TRUE(by_kl.first_over);
  EXPECT_TRUE(by_kl.by_kl);
  Tolerances top1;
  top1.min_top1 = 0.9;  // 2 of 3 agree
  const Verdict by_top1 = judge(d, top1);
  EXPECT_FALSE(by_top1.ok);
  EXPECT_EQ(by_top1.bound, "top-1 agreement >= 0.9");
  EXPECT_NE(by_top1.why.find("66.7% < 90.0%"), std::string::npos) << by_top1.why;
  top1.min_top1 = 0.5;
  EXPECT_TRUE(judge(d, top1).ok);
  d.diffs[2] = std::nan("");  // a NaN is over every bound
  d.kl[2] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(judge(d, kl).ok);
}

TEST(Judge, EveryReferenceRowReportsAndObeysTheBoundTheUserSet) {
  GPT model(small_config(), 11);
  model->eval();
  int judged = 0;
  for (const CheckDef& row : model_checks()) {
    if (row.judge != Judge::Reference || row.is(Tag::EngineOnly)) continue;  // targets against themselves judge by their own bound
    const CacheVariant* fault = fault_for(model, row);
    ASSERT_NE(fault, nullptr) << row.name << ": no fault of the catalogue fails it by the numbers";
    SCOPED_TRACE(row.name + " on " + fault->name);
    const CheckResult fp32 = run_row(model, row, *fault, Tolerances{});
    ASSERT_EQ(fp32.status, Status::Fail) << "the fault must fail the row at the fp32 bound: " << fp32.detail;
    Tolerances tight, loose, sure, any;
    tight.max_kl = 1e-30;
    loose.max_kl = 1e30;
    const CheckResult a = run_row(model, row, *fault, tight), b = run_row(model, row, *fault, loose);
    EXPECT_EQ(a.status, Status::Fail) << a.detail;
    EXPECT_NE(a.bound.find("mean KL <= 1.00e-30"), std::string::npos) << a.bound;
    EXPECT_EQ(b.status, Status::Pass) << "a bound of 1e30 on the mean KL passes whatever the |diff|: " << b.detail;
    EXPECT_NE(b.bound.find("mean KL <= 1.00e+30"), std::string::npos) << b.bound;
    any.min_top1 = 1e-9;
    const CheckResult c = run_row(model, row, *fault, any);
    EXPECT_EQ(c.status, Status::Pass) << "any top-1 agreement at all passes: " << c.detail;
    EXPECT_NE(c.bound.find("top-1 agreement >= 1e-09"), std::string::npos) << c.bound;
    ++judged;
  }
  EXPECT_GE(judged, 14) << "every row judged against our reference model";
}

// --min-top1 decides churn and context-shift as it decides every row: with it alone, a fault that moves
// the logits but keeps the argmax passes (the |diff| bound no longer judges), and one whose argmax
// parts fails at a bound of 1.
TEST(Judge, MinTop1DecidesChurnAndContextShift) {
  GPT model(small_config(), 11);
  model->eval();
  for (const char* name : {check::kChurn, check::kContextShift}) {
    const CheckDef& row = find_check(name);
    const CacheVariant* fault = fault_for(model, row);
    ASSERT_NE(fault, nullptr) << name;
    SCOPED_TRACE(std::string(name) + " on " + fault->name);
    ASSERT_EQ(run_row(model, row, *fault, Tolerances{}).status, Status::Fail);
    Tolerances loose, strict;
    loose.min_top1 = 1e-9;
    strict.min_top1 = 1.0;
    const CheckResult l = run_row(model, row, *fault, loose), s = run_row(model, row, *fault, strict);
    EXPECT_EQ(l.status, Status::Pass) << "only --min-top1 judges: " << l.detail;
    EXPECT_NE(l.bound.find("top-1 agreement"), std::string::npos) << l.bound;
    EXPECT_NE(s.bound.find("top-1 agreement >= 1"), std::string::npos) << s.bound;
    if (s.status == Status::Fail) {
      EXPECT_NE(s.detail.find("top-1 agreement"), std::string::npos) << s.detail;
    }
  }
}

}  // namespace
}  // namespace tinygpt::checks
