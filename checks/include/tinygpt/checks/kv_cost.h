// What a low-precision KV cache costs, position by position: one teacher-forced run through the
// cache against the same target with an fp32 cache (the same arithmetic: only the cache's precision
// differs) and against our fp32 model, judged by a mean-KL budget (docs/checks.md, "Low-precision caches").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "tinygpt/checks/judge.h"
#include "tinygpt/checks/reference.h"
#include "tinygpt/checks/results.h"

namespace tinygpt::checks {

// What a KV cache type costs on one run, position by position (ConformOptions::kv_budget).
struct KvCost {
  std::string kind = "kv";  // what the type is of: "kv" (a cache type) or "weight" (the weights')
  std::string kv_type;      // the type
  std::string baseline;   // the fp32 run's name ("f32"); empty when there is none
  StepDiffs vs_baseline;  // the type's teacher-forced logits against the fp32-cache run's (empty without one)
  StepDiffs vs_model;     // against our fp32 model (the banded reference: the rolling cache's semantics)
  double budget = 0;
  std::optional<double> min_top1;  // unset: the budget gates on KL alone
  // "KV cache q8_0" or "weights q4_0"; the baseline in words: "an f32 cache" or "f32 weights".
  std::string what() const { return (kind == "kv" ? "KV cache " : "weights ") + kv_type; }
  std::string baseline_words() const { return kind == "kv" ? "an " + baseline + " cache" : baseline + " weights"; }
  // What the verdict is judged against: vs_baseline when there is one, else vs_model.
  const StepDiffs& judged() const { return baseline.empty() ? vs_model : vs_baseline; }
  // The first position whose step's KL exceeds the budget, if any.
  std::optional<int64_t> first_over_budget() const;
  // The budget as bounds of the one judge (judge.h): mean KL <= budget, and top-1 >= min_top1 when set.
  Tolerances bounds() const;
  bool passed() const;
};
// The 99th percentile of a run's per-step KL (0 when empty).
double kl_p99(const StepDiffs& d);
// Its row of a report: `kv-budget [TYPE]` (`weight-budget [TYPE]`), judged by the budget, every figure in its stats.
CheckResult kv_budget_row(const KvCost& k);
// "mean KL per step .. (p99 .., max ..), top-1 agreement ..%, first argmax parting at position ..".
std::string kv_stats_text(const StepDiffs& d);

class DecodeTarget;
// The teacher-forced logits (B, tokens, V) of the reference's sequence through `t` from `prompt`
// (the `teacher-forced` row's run).
at::Tensor forced_logits(DecodeTarget& t, const at::Tensor& prompt, int64_t tokens, const Reference& ref);
// `got` (B, n, V) against `baseline` (the same run with an fp32 cache, named `baseline_name`; undefined:
// none) and the reference's banded logits, for a prompt of T0 tokens.
KvCost kv_cost_of(const std::string& type, const std::string& baseline_name, const at::Tensor& got, const at::Tensor& baseline,
                  const Reference& ref, int64_t T0, double budget, std::optional<double> min_top1, double tol);

}  // namespace tinygpt::checks
