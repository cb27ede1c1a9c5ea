// What a failing run's failures match: the model rows that failed, with where each first went over
// its bound, against the fault catalogue run on our own model through the same rows. A fault
// matches when on our model it fails exactly those rows, first at the same positions: "these
// failures match the fault never-trimmed", with what to do about it where there is something.
// `tinygpt conform --diagnose` (it reruns candidate faults: seconds to a few minutes).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tinygpt/checks/check_suite.h"

namespace tinygpt::checks {

struct Diagnosis {
  std::vector<std::string> failing;  // the model rows that failed, in table order
  std::vector<std::string> matches;  // faults that fail exactly those rows at the same first positions
  std::string closest;               // with no match: the fault whose failing rows overlap most ("" if none)
  std::string text;                  // the finding, one paragraph, for the console and the reports
  bool ran() const { return !failing.empty(); }
};

// `rows`: a run's results (conform's or equivalence's); `opts`: the options that run used, so each
// fault runs the same prompt, tokens and bounds. Faults run side by side (run_in_parallel).
Diagnosis diagnose(GPT& model, const EquivalenceOptions& opts, const std::vector<CheckResult>& rows,
                   const std::function<void(const std::string&)>& progress = {});

}  // namespace tinygpt::checks
