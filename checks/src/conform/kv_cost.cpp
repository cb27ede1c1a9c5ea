// What a low-precision KV cache costs an engine, position by position: the same teacher-forced run
// through the engine with that cache type and with an fp32 cache (the one comparison that isolates
// the cache's precision: the same engine, the same approximations), and against our fp32 model.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "remote_target.h"
#include "tinygpt/checks/conform.h"
#include "tinygpt/checks/judge.h"
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

namespace {

// The teacher-forced logits of another instance of the engine, loaded at `precision`.
at::Tensor forced_logits_of(const ConformOptions& o, const EnginePrecision& precision, const EquivalenceOptions& eo, const Reference& ref,
                            int64_t vocab, int64_t context) {
  LoadedEngine e(o.engine, o.checkpoint, o.timeout_s, nullptr, precision);
  RemoteTarget t(e.process(), e.hello(), vocab, context);
  const at::Tensor l = forced_logits(t, eo.prompt, eo.tokens, ref);
  e.process().quit();
  return l;
}

bool lists_f32(const std::vector<std::string>& listed) { return std::find(listed.begin(), listed.end(), "f32") != listed.end(); }

}  // namespace

std::vector<KvCost> kv_costs(const ConformOptions& o, const nlohmann::json& hello, DecodeTarget& main, const EquivalenceOptions& eo,
                             const Reference& ref, int64_t vocab, int64_t context, DecodeTarget* baseline_target) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  const std::vector<std::string> listed = hello_kv_types(hello);
  const std::string baseline = lists_f32(listed) ? "f32" : "";
  std::vector<std::string> types;
  if (!o.kv_type.empty()) types.push_back(o.kv_type);
  for (const auto& t : o.kv_compare)
    if (std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
  // Another instance of the engine with another cache type, driven through the same run.
  auto run_with = [&](const std::string& type) {
    if (type == o.kv_type) return forced_logits(main, eo.prompt, eo.tokens, ref);
    return forced_logits_of(o, EnginePrecision{type, o.weight_type}, eo, ref, vocab, context);
  };
  const int64_t T0 = eo.prompt.size(1);
  at::Tensor base;  // (1, n, V)
  if (!baseline.empty()) {
    say("kv cost: the teacher-forced run with an " + baseline + " cache (the baseline)");
    base = baseline_target ? forced_logits(*baseline_target, eo.prompt, eo.tokens, ref) : run_with(baseline);
  }
  std::vector<KvCost> out;
  for (const auto& type : types) {
    say("kv cost: the teacher-forced run with a " + type + " cache");
    const at::Tensor l = type == baseline ? base : run_with(type);
    out.push_back(kv_cost_of(type, baseline, l, base, ref, T0, o.kv_budget, o.kv_min_top1, o.tolerance.logits));
  }
  return out;
}

KvCost weight_cost(const ConformOptions& o, const nlohmann::json& hello, DecodeTarget& main, const EquivalenceOptions& eo,
                   const Reference& ref, int64_t vocab, int64_t context, DecodeTarget* baseline) {
  if (o.progress) o.progress("weight cost: the teacher-forced run with " + o.weight_type + " weights");
  const at::Tensor got = forced_logits(main, eo.prompt, eo.tokens, ref);
  at::Tensor base;  // (1, n, V); undefined where the engine has no f32 weights
  if (lists_f32(hello_weight_types(hello)))
    base = baseline ? forced_logits(*baseline, eo.prompt, eo.tokens, ref)
                    : forced_logits_of(o, EnginePrecision{o.kv_type, "f32"}, eo, ref, vocab, context);
  KvCost w = kv_cost_of(o.weight_type, "f32", got, base, ref, eo.prompt.size(1), o.weights_budget(), o.kv_min_top1, o.tolerance.logits);
  w.kind = "weight";
  return w;
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
