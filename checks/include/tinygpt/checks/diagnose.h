// What a failing run's failures match: the model rows that failed, each with its signature, against
// the fault catalogue run on our own model through the same rows (and the same held-out variation).
// A failing row's signature is the operation its first divergence followed and the entries it touched,
// which a bug keeps across engines however they schedule the work:
//   - churn (a seeded plan of every operation): the operations between the failing row's last right
//     logits and its first wrong ones (fork, release + admit, extend, shift, restore, truncate, ...;
//     ChurnSignature) share one;
//   - a row whose operation is the check's own (join-leave: release + admit into a released slot;
//     context-shift: a shift; ...; docs/checks.md lists each) - where the check also fixes the schedule,
//     the first position, and a like |diff| there and at the row's worst (within 3x) with the same peak;
//     where the engine chooses what it reuses or schedules (prefix-reuse, served), the position only ranks.
// A fault is named when on our model it fails one of the engine's rows with a serving operation, or
// the same plain rows, and every row both fail has the same signature. The failing rows only rank: the
// same rows first, then the most rows in common, then positions and magnitudes; a fault that fails more
// or fewer rows than the engine is named with the difference said. "These failures match the fault
// NAME", with what to do about it; or "no known fault", saying what the rows showed: the operation each
// failure followed, the entries involved, the first position in the request's frame and the engine's.
// `tinygpt conform --diagnose`, `tinygpt equivalence --diagnose` (they rerun the candidate faults:
// seconds to a few minutes).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tinygpt/checks/check_suite.h"

namespace tinygpt::checks {

struct Diagnosis {
  std::vector<std::string> failing;  // the model rows that failed, in table order
  std::vector<std::string> matches;  // faults that fail exactly those rows at the same first positions
  std::string closest;               // with no match: the fault whose failing rows overlap most ("" if none)
  // For the fault named: the rows it fails on our model that the engine passed, and those the engine
  // fails that it passes ("" when it fails exactly the engine's rows).
  std::string differs;
  std::string saw;                   // what the failing rows showed: the operation each followed, where (one line)
  std::string text;                  // the finding, one paragraph, for the console and the reports
  bool ran() const { return !failing.empty(); }
};

// {"failing", "matches", "closest", "saw", "text"}: the reports' "diagnosis" (docs/reports.md).
nlohmann::json to_json(const Diagnosis& d);

// `rows`: a run's results (conform's or equivalence's); `opts`: the options that run used, so each
// fault runs the same prompt, tokens and bounds. Faults run side by side (run_in_parallel).
Diagnosis diagnose(GPT& model, const EquivalenceOptions& opts, const std::vector<CheckResult>& rows,
                   const std::function<void(const std::string&)>& progress = {});

}  // namespace tinygpt::checks
