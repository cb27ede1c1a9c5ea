#include "report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unistd.h>

namespace tinygpt::checks {

namespace {
nlohmann::json checks_json(const std::vector<SubCheck>& checks) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& c : checks) a.push_back({{"name", c.name}, {"passed", c.passed}, {"detail", c.detail}});
  return a;
}
template <typename T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
}  // namespace

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
          {"tolerance", r.tolerance},
          {"tolerance_reason", kLogitToleranceReason},
          {"logits", {{"worst_diff", r.worst_window_diff},
                      {"worst_position", r.worst_window_position},
                      {"first_position_over", opt(r.first_window_step_over)},
                      {"per_step_diff", r.window_diffs}}},
          {"window_reference", {{"worst_diff", r.worst_band_diff},
                                {"worst_position", r.worst_band_position},
                                {"first_position_over", opt(r.first_band_step_over)}}},
          {"checks", checks_json(r.checks)}};
}

nlohmann::json to_json(const InjectionReport& r) {
  nlohmann::json faults = nlohmann::json::array();
  for (const auto& f : r.faults)
    faults.push_back({{"fault", f.fault},
                      {"description", f.description},
                      {"caught", f.caught()},
                      {"checks", checks_json(f.checks)},
                      {"drift_after", opt(f.drift_after)},
                      {"drift_window", f.drift_window},
                      {"first_logit_position_over", opt(f.first_logit_position_over)},
                      {"worst_logit_diff", f.worst_logit_diff}});
  return {{"passed", r.passed()},
          {"caught", r.caught()},
          {"total", r.faults.size()},
          {"control", to_json(r.control)},
          {"faults", faults}};
}

void write_json_atomically(const std::string& path, const nlohmann::json& doc) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path tmp = target.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
    out << doc.dump(2) << "\n";
    out.flush();
    if (!out) {
      out.close();
      fs::remove(tmp);
      throw std::runtime_error("failed writing " + tmp.string());
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp);
    throw std::runtime_error("cannot move report into place at " + path + ": " + ec.message());
  }
}

}  // namespace tinygpt::checks
