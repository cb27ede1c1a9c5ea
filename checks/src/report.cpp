#include "report.h"

#include "tinygpt/atomic_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unistd.h>

#include <sstream>

namespace tinygpt::checks {

namespace {
nlohmann::json checks_json(const std::vector<SubCheck>& checks) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& c : checks) a.push_back({{"name", c.name}, {"passed", c.passed}, {"detail", c.detail}, {"seconds", c.seconds}});
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
          {"tolerance_reason", kLogitToleranceReason},
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
                      {"expected", f.expected},
                      {"missed_expected", f.missed_expected()},
                      {"checks", checks_json(f.checks)},
                      {"drift_after", opt(f.drift_after)},
                      {"drift_window", f.drift_window},
                      {"first_logit_position_over", opt(f.first_logit_position_over)},
                      {"worst_logit_diff", f.worst_logit_diff},
                      {"per_step_diff", f.step_diffs}});
  nlohmann::json controls = nlohmann::json::array();
  for (const auto& c : r.controls) controls.push_back(to_json(c));
  return {{"passed", r.passed()},
          {"caught", r.caught()},
          {"total", r.faults.size()},
          {"controls", controls},
          {"faults", faults}};
}

void write_json_atomically(const std::string& path, const nlohmann::json& doc) {
  write_atomically(path, [&](std::ostream& out) { out << doc.dump(2) << "\n"; });
}

}  // namespace tinygpt::checks

namespace tinygpt::checks {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') ? ' ' : c;
    }
  }
  return o;
}


std::string format_verify_table(const std::vector<VerifyRow>& rows, const std::string& command) {
  size_t w = 5;
  for (const auto& r : rows) w = std::max(w, r.check.size());
  std::ostringstream s;
  char line[1024];
  std::snprintf(line, sizeof line, "%-*s  %-7s  %8s  %s\n", static_cast<int>(w), "check", "verdict", "time", "key figure");
  s << line;
  int failed = 0;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-*s  %-7s  %7.1fs  %s\n", static_cast<int>(w), r.check.c_str(), r.passed ? "PASS" : "FAIL",
                  r.seconds, r.figure.c_str());
    s << line;
    failed += !r.passed;
  }
  s << (failed ? command + ": FAILED (" + std::to_string(failed) + " of " + std::to_string(rows.size()) + " checks)\n"
               : command + ": all " + std::to_string(rows.size()) + " checks passed\n");
  return s.str();
}

nlohmann::json to_json(const std::vector<VerifyRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  bool ok = true;
  for (const auto& r : rows) {
    a.push_back({{"check", r.check}, {"passed", r.passed}, {"figure", r.figure}, {"seconds", r.seconds}});
    ok &= r.passed;
  }
  return {{"passed", ok}, {"checks", a}};
}

void write_junit(const std::string& path, const std::vector<VerifyRow>& rows) {
  int failures = 0;
  double total = 0;
  for (const auto& r : rows) failures += !r.passed, total += r.seconds;
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<testsuite name=\"tinygpt-verify\" tests=\"" << rows.size() << "\" failures=\"" << failures << "\" time=\"" << total << "\">\n";
  for (const auto& r : rows) {
    x << "  <testcase classname=\"tinygpt.verify\" name=\"" << xml_escape(r.check) << "\" time=\"" << r.seconds << "\"";
    if (r.passed) x << "><system-out>" << xml_escape(r.figure) << "</system-out></testcase>\n";
    else x << "><failure message=\"" << xml_escape(r.figure) << "\"/></testcase>\n";
  }
  x << "</testsuite>\n";
  write_atomically(path, [&](std::ostream& out) { out << x.str(); });
}

}  // namespace tinygpt::checks
