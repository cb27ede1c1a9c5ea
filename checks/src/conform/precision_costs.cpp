// What a low-precision KV cache or quantized weights cost an engine, position by position: the same
// teacher-forced run through the engine at that precision and at fp32 (the one comparison that
// isolates the precision: the same engine, the same approximations), and against our fp32 model.
#include <ATen/ATen.h>

#include <algorithm>

#include "remote_target.h"
#include "tinygpt/checks/conform.h"
#include "tinygpt/checks/kv_cost.h"

namespace tinygpt::checks {

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

}  // namespace tinygpt::checks
