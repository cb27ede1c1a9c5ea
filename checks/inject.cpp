#include "inject.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <sstream>

namespace tinygpt::checks {

bool FaultOutcome::caught() const {
  for (const auto& c : checks)
    if (!c.passed) return true;
  return false;
}

int InjectionReport::caught() const {
  int n = 0;
  for (const auto& f : faults) n += f.caught();
  return n;
}

bool InjectionReport::passed() const { return control.passed() && caught() == static_cast<int>(faults.size()); }

InjectionReport run_injection(GPT& model, const EquivalenceOptions& opts,
                              const std::vector<const CacheVariant*>& faults, int64_t drift_tokens,
                              const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) { if (progress) progress(s); };
  say("reference: uncached greedy run and full-forward logits");
  const Reference ref = build_reference(model, opts);
  const CacheVariant& rolling = cache_registry().get("rolling");
  InjectionReport rep;
  say("negative control: rolling");
  rep.control = check_equivalence(model, opts, ref, rolling);
  const at::Tensor correct = cached_greedy(model, opts.prompt, drift_tokens, rolling);
  for (const CacheVariant* v : faults) {
    say("fault " + v->name);
    FaultOutcome f;
    f.fault = v->name;
    f.description = v->description;
    f.drift_window = drift_tokens;
    EquivalenceResult r = check_equivalence(model, opts, ref, *v);
    f.checks = r.checks;
    f.worst_logit_diff = std::max(r.worst_window_diff, r.worst_band_diff);
    if (r.first_window_step_over || r.first_band_step_over)
      f.first_logit_position_over = std::min(r.first_window_step_over.value_or(INT64_MAX),
                                             r.first_band_step_over.value_or(INT64_MAX));
    try {
      at::Tensor got = cached_greedy(model, opts.prompt, drift_tokens, *v);
      at::Tensor same = (got == correct).all(0).narrow(0, opts.prompt.size(1), drift_tokens);
      at::Tensor diff = same.logical_not().nonzero();
      if (diff.numel()) f.drift_after = diff[0][0].item<int64_t>();
    } catch (const std::exception&) {
      f.drift_after = 0;  // it could not even generate
    }
    rep.faults.push_back(std::move(f));
  }
  return rep;
}

std::string format_injection(const InjectionReport& r) {
  std::ostringstream s;
  char line[512];
  std::snprintf(line, sizeof line, "%-22s %-8s %-8s %-16s %-7s %-12s %s\n", "fault", "tokens", "logits",
                "window-reference", "batch", "drift", "first logit over tol (worst |diff|)");
  s << line;
  auto verdict = [](const SubCheck& c) { return c.passed ? (c.detail.rfind("n/a", 0) == 0 ? "n/a" : "missed") : "CAUGHT"; };
  for (const auto& f : r.faults) {
    const std::string drift = f.drift_after ? "after " + std::to_string(*f.drift_after) : "none/" + std::to_string(f.drift_window);
    char over[96];
    if (f.first_logit_position_over)
      std::snprintf(over, sizeof over, "pos %lld (%.2e)", static_cast<long long>(*f.first_logit_position_over), f.worst_logit_diff);
    else
      std::snprintf(over, sizeof over, "none (%.2e)", f.worst_logit_diff);
    std::snprintf(line, sizeof line, "%-22s %-8s %-8s %-16s %-7s %-12s %s\n", f.fault.c_str(), verdict(f.checks[0]),
                  verdict(f.checks[1]), verdict(f.checks[2]), verdict(f.checks[3]), drift.c_str(), over);
    s << line;
  }
  s << "negative control (rolling): " << (r.control.passed() ? "passes every check" : "FAILS") << "\n";
  s << "mutation score: " << r.caught() << "/" << r.faults.size() << " faults caught\n";
  return s.str();
}

}  // namespace tinygpt::checks
