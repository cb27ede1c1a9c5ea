// Fault injection: every fault variant runs through every check; the matrix says which check
// caught which fault. A fault no check catches fails the run.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "equivalence.h"

namespace tinygpt::checks {

struct FaultOutcome {
  std::string fault, description;
  std::vector<SubCheck> checks;  // the equivalence sub-checks, passed == not caught
  // Identical new tokens before the fault's greedy output leaves the correct cached output
  // (the seed's measure over 100 tokens); nullopt when it never drifts.
  std::optional<int64_t> drift_after;
  int64_t drift_window = 100;
  std::optional<int64_t> first_logit_position_over;  // first position over tolerance, either reference
  double worst_logit_diff = 0;
  bool caught() const;
};

struct InjectionReport {
  std::vector<FaultOutcome> faults;
  EquivalenceResult control;  // the production cache through the same checks (must pass)
  int caught() const;
  bool passed() const;  // control passed and every fault caught
};

InjectionReport run_injection(GPT& model, const EquivalenceOptions& opts,
                              const std::vector<const CacheVariant*>& faults, int64_t drift_tokens = 100,
                              const std::function<void(const std::string&)>& progress = {});

std::string format_injection(const InjectionReport& r);

}  // namespace tinygpt::checks
