// Reports a person looks at: one self-contained HTML page (inline SVG drawn here, no script, no
// network) and the same summary as Markdown for CI step summaries. Both are views of the same
// inputs as the console table and the JSON report.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tinygpt/checks/kv_cost.h"
#include "tinygpt/checks/inject.h"
#include "tinygpt/checks/results.h"

namespace tinygpt::tools {

struct ReportInput {
  std::string command = "verify";      // what produced it: verify, inject, equivalence, conform
  std::string subject;                  // the model (and engine) checked
  std::vector<results::CheckResult> rows;        // the summary table
  const checks::InjectionReport* injection = nullptr;  // drift plots, detection matrix, mutation score
  const checks::EquivalenceResult* single = nullptr;   // one cache's run (equivalence): its own plot
  const std::vector<checks::KvCost>* kv = nullptr;     // conform --kv-type/--kv-compare: each type's cost per position
  nlohmann::json bench;                 // BenchReport::to_json(), or null
  nlohmann::json provenance;            // commit, libtorch, blas, device, threads, cpu
  int64_t context = 256;
  double tolerance = checks::kLogitTolerance;
};

std::string render_html(const ReportInput& in);
std::string render_markdown(const ReportInput& in);

}  // namespace tinygpt::tools
