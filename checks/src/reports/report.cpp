#include "tinygpt/checks/report.h"

#include "tinygpt/atomic_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unistd.h>

#include <sstream>

namespace tinygpt::checks {

namespace {
// The checks of one run: the fields of every result row, plus "name" and "detail" (the names the
// equivalence and matrix reports use for "check" and "figure"; docs/reports.md).
nlohmann::json checks_json(const std::vector<CheckResult>& checks) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& c : checks) {
    nlohmann::json j = to_json(c);
    j["name"] = c.name;
    j["detail"] = c.detail;
    a.push_back(j);
  }
  return a;
}
template <typename T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
}  // namespace

nlohmann::json to_json(const StepDiffs& d) {
  return {{"worst_diff", d.worst},
          {"worst_position", d.worst_position},
          {"top1_agreement", d.top1_agreement()},
          {"kl_mean", d.kl_mean()},
          {"kl_max", d.kl_max()},
          {"first_position", d.first_position},
          {"first_position_over", opt(d.first_position_over)},
          {"per_step_diff", d.diffs}};
}

nlohmann::json to_json(const EquivalenceResult& r) {
  return {{"cache", r.cache},
          {"passed", r.passed()},
          {"prompt_len", r.prompt_len},
          {"tokens", r.tokens},
          {"batch", r.batch},
          {"context", r.context},
          {"sequence_length", r.sequence_length},
          {"must_match", r.must_match},
          {"identical_prefix", r.identical_prefix},
          {"first_difference", opt(r.first_difference)},
          {"margin_at_difference", opt(r.margin_at_difference)},
          {"step_margins", r.step_margins},
          {"tolerance", r.tolerance},
          {"tolerance_reason", r.tolerance_reason},
          {"logits", to_json(r.loop_full)},
          {"window_reference", to_json(r.loop_band)},
          {"teacher_forced", {{"full", to_json(r.forced_full)}, {"band", to_json(r.forced_band)}}},
          {"checks", checks_json(r.checks)}};
}

nlohmann::json to_json(const InjectionReport& r) {
  nlohmann::json faults = nlohmann::json::array();
  for (const auto& f : r.faults)
    faults.push_back({{"fault", f.fault},
                      {"description", f.description},
                      {"caught", f.caught()},
                      {"observable", f.observable},
                      {"effect", f.effect_measured ? nlohmann::json(f.effect) : nlohmann::json()},
                      {"noise", f.effect_measured ? nlohmann::json(f.noise) : nlohmann::json()},
                      {"not_observable_why", f.observable ? nlohmann::json() : nlohmann::json(f.inert_why)},
                      {"expected", f.expected},
                      {"missed_expected", f.missed_expected()},
                      {"errors", f.errors()},
                      {"checks", checks_json(f.checks)},
                      {"drift_after", opt(f.drift_after)},
                      {"drift_window", f.drift_window},
                      {"first_logit_position_over", opt(f.first_logit_position_over)},
                      {"worst_logit_diff", f.worst_logit_diff},
                      {"per_step_diff", f.step_diffs}});
  nlohmann::json controls = nlohmann::json::array();
  for (const auto& c : r.controls) controls.push_back(to_json(c));
  // The matrix as every view prints it: a symbol per fault and check (cell_symbol).
  const FaultMatrix m = fault_matrix(r);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < m.faults.size(); ++i) {
    nlohmann::json cells = nlohmann::json::array();
    for (const auto& c : m.cells[i]) cells.push_back(cell_symbol(c));
    rows.push_back({{"fault", m.faults[i]->fault}, {"cells", cells}});
  }
  return {{"passed", r.passed()},
          {"caught", r.caught()},
          {"total", r.faults.size()},
          {"observable", r.observable()},
          {"controls", controls},
          {"faults", faults},
          {"matrix", {{"checks", m.checks}, {"legend", kMatrixLegend}, {"rows", rows}}}};
}

namespace {

// Each KV type's cost: its figures and, per step, the KL and top-1 against each reference.
nlohmann::json kv_json(const std::vector<KvCost>& kv) {
  auto per_position = [](const StepDiffs& d) {
    std::vector<int> top1(d.top1.begin(), d.top1.end());
    nlohmann::json j = to_json(d);
    j["kl_p99"] = kl_p99(d);
    j["per_step_kl"] = d.kl;
    j["per_step_top1"] = top1;
    j["first_top1_parting"] = opt(d.first_top1_parting);
    return j;
  };
  nlohmann::json out = nlohmann::json::array();
  for (const auto& k : kv) {
    nlohmann::json j = {{"kind", k.kind}, {"kv_type", k.kv_type}, {"baseline", k.baseline.empty() ? nlohmann::json(nullptr) : nlohmann::json(k.baseline)},
                        {"budget", k.budget}, {"min_top1", opt(k.min_top1)}, {"passed", k.passed()},
                        {"first_over_budget", opt(k.first_over_budget())}, {"vs_model", per_position(k.vs_model)}};
    if (!k.baseline.empty()) j["vs_baseline"] = per_position(k.vs_baseline);
    out.push_back(j);
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const VerifyReport& r) {
  nlohmann::json doc = to_json(r.rows);
  doc["subject"] = r.subject;
  doc["fault_matrix"] = to_json(r.matrix);
  if (!r.kv.empty()) doc["kv_cost"] = kv_json(r.kv);
  return doc;
}

nlohmann::json to_json(const ConformReport& r) {
  nlohmann::json doc = to_json(r.rows);
  doc["engine"] = r.engine_name;
  doc["command"] = r.command;
  doc["protocol"] = r.protocol;
  if (!r.kv_type.empty()) doc["kv_type"] = r.kv_type;
  if (!r.weight_type.empty()) doc["weight_type"] = r.weight_type;
  doc["checkpoint"] = r.checkpoint;
  doc["passed"] = r.passed();
  doc["tolerance"] = r.model.tolerance;
  doc["past_window"] = r.past_window;
  doc["deviations"] = r.deviations;
  doc["requests"] = r.requests;
  doc["fatal"] = r.fatal ? nlohmann::json(*r.fatal) : nlohmann::json(nullptr);
  doc["rows"] = doc["checks"];  // the same list under the name conform reports also use (docs/reports.md)
  if (r.diagnosis.ran())
    doc["diagnosis"] = to_json(r.diagnosis);
  if (!r.kv.empty()) doc["kv_cost"] = kv_json(r.kv);
  if (!r.repros.empty()) {
    nlohmann::json repros = nlohmann::json::array();
    for (const ReproResult& x : r.repros)
      repros.push_back({{"row", x.row}, {"sent_by", x.sent_by.empty() ? nlohmann::json(nullptr) : nlohmann::json(x.sent_by)},
                         {"after", x.after.empty() ? nlohmann::json(nullptr) : nlohmann::json(x.after)}, {"dir", x.dir.empty() ? nlohmann::json(nullptr) : nlohmann::json(x.dir)},
                        {"why_not", x.why_not.empty() ? nlohmann::json(nullptr) : nlohmann::json(x.why_not)},
                        {"requests_before", x.requests_before}, {"requests_after", x.requests_after},
                        {"candidates", x.candidates}, {"seconds", x.seconds}, {"failure", x.failure},
                        {"matches", x.matches}, {"diagnosis", x.diagnosis}});
    doc["repros"] = repros;
  }
  return doc;
}

}  // namespace tinygpt::checks
