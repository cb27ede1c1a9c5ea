// JSON views of the harness's reports (schemas in docs/reports.md). The rows themselves print
// through result.h; these add the figures behind them (per-step differences, the fault matrix).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/conform.h"
#include "tinygpt/checks/inject.h"
#include "tinygpt/checks/verify.h"

namespace tinygpt::checks {

nlohmann::json to_json(const StepDiffs& d);
nlohmann::json to_json(const EquivalenceResult& r);
nlohmann::json to_json(const InjectionReport& r);
// {passed, counts, checks: [...], fault_matrix: {...}}
nlohmann::json to_json(const VerifyReport& r);
// {engine, command, protocol, checkpoint, passed, tolerance, past_window, deviations, requests, checks: [...]}
nlohmann::json to_json(const ConformReport& r);

}  // namespace tinygpt::checks
