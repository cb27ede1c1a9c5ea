// What a precision costs, position by position (kv_cost.h): a type's teacher-forced logits against an
// fp32 run's and against our fp32 model's, and the row that judges it. conform/precision_costs.cpp
// starts the engine instances those runs come from.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tinygpt/checks/kv_cost.h"

#include "tinygpt/checks/judge.h"
#include "tinygpt/checks/target.h"
#include "tinygpt/checks/results.h"

namespace tinygpt::checks {

double kl_p99(const StepDiffs& d) {
  if (d.kl.empty()) return 0;
  std::vector<double> k = d.kl;
  const auto i = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(k.size()))) - 1;
  std::nth_element(k.begin(), k.begin() + static_cast<std::ptrdiff_t>(i), k.end());
  return k[i];
}

std::optional<int64_t> KvCost::first_over_budget() const {
  const StepDiffs& d = judged();
  const auto i = d.first_kl_over(budget);
  return i ? std::optional<int64_t>(d.first_position + static_cast<int64_t>(*i)) : std::nullopt;
}

bool KvCost::passed() const {
  const StepDiffs& d = judged();
  return !d.kl.empty() && judge(d, bounds()).ok;
}

Tolerances KvCost::bounds() const {  // the budget is a bound like --max-kl, judged by the one judge
  Tolerances t;
  t.max_kl = budget;
  t.min_top1 = min_top1;
  return t;
}

namespace {

std::string pct(double share) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * share);
  return b;
}

}  // namespace

at::Tensor forced_logits(DecodeTarget& t, const at::Tensor& prompt, int64_t tokens, const Reference& ref) {
  const at::Tensor seq = ref.uncached;
  const TokenChooser forced = [&](const at::Tensor& logits, const at::Tensor& history) {
    return seq.select(1, history.size(1)).to(logits.device());  // the reference's next token
  };
  return t.drive(prompt, tokens, forced).logits;
}

KvCost kv_cost_of(const std::string& type, const std::string& baseline_name, const at::Tensor& got, const at::Tensor& baseline,
                  const Reference& ref, int64_t T0, double budget, std::optional<double> min_top1, double tol) {
  KvCost k;
  k.kv_type = type;
  k.baseline = baseline.defined() ? baseline_name : "";
  k.budget = budget;
  k.min_top1 = min_top1;
  if (baseline.defined()) k.vs_baseline = compare_steps(got, baseline, T0 - 1, tol);
  k.vs_model = compare_steps(got, ref.steps.band, T0 - 1, tol);
  return k;
}

std::string kv_stats_text(const StepDiffs& d) {
  std::string s = "mean KL per step " + sci(d.kl_mean()) + " (p99 " + sci(kl_p99(d)) + ", max " + sci(d.kl_max()) + "), top-1 agreement " +
                  pct(d.top1_agreement()) + ", ";
  s += d.first_top1_parting ? "first argmax parting at position " + std::to_string(*d.first_top1_parting) + " (top-2 margin " +
                                  sci(d.margin_at_parting) + ")"
                            : std::string("no argmax parting");
  return s + ", worst |diff| " + sci(d.worst) + " at position " + std::to_string(d.worst_position);
}

CheckResult kv_budget_row(const KvCost& k) {
  CheckResult r;
  r.name = k.kind + "-budget [" + k.kv_type + "]";
  const StepDiffs& d = k.judged();
  r.status = k.passed() ? Status::Pass : Status::Fail;
  r.figure = d.kl_mean();
  r.stats["kl_mean"] = d.kl_mean();
  r.stats["kl_p99"] = kl_p99(d);
  r.stats["kl_max"] = d.kl_max();
  r.stats["top1_agreement"] = d.top1_agreement();
  if (d.first_top1_parting) r.stats["first_parting"] = static_cast<double>(*d.first_top1_parting);
  const auto over = k.first_over_budget();
  if (over) r.stats["first_kl_over"] = static_cast<double>(*over);
  r.stats["model_kl_mean"] = k.vs_model.kl_mean();
  const std::string against = k.baseline.empty() ? "our fp32 model (the target has no f32" + std::string(k.kind == "kv" ? " cache" : " weights") + ")"
                                                 : "the same target with " + k.baseline_words();
  std::string budget = "budget: mean KL <= " + sci(k.budget);
  if (k.min_top1) budget += ", top-1 >= " + pct(*k.min_top1);
  budget += over ? "; first step over it at position " + std::to_string(*over) + " (KL " +
                       sci(d.kl[static_cast<size_t>(*over - d.first_position)]) + ")"
                 : "; no step over it";
  r.detail = "teacher-forced over " + std::to_string(d.kl.size()) + " steps, against " + against + ": " + kv_stats_text(d) + "; " +
             (k.baseline.empty() ? std::string() : "against our fp32 model: " + kv_stats_text(k.vs_model) + "; ") + budget;
  return r;
}

}  // namespace tinygpt::checks
