// Writing a command's human reports (--html, --markdown) and reading what they embed.
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <string>

#include "cli_common.h"
#include "tinygpt/tools/html_report.h"

namespace tinygpt::cli {

// The --bench-json file (a `tinygpt bench --json` report), or null when none was given. A file that
// is not such a report is refused (InputError) before any work is done.
nlohmann::json read_bench_json(const std::string& path);
// commit, LibTorch, BLAS, device, threads, CPU.
nlohmann::json report_provenance(c10::Device device);
// `report` with its "provenance" (report_provenance): what every JSON report records of the machine.
nlohmann::json with_provenance(nlohmann::json report, c10::Device device);
// Writes the HTML and/or Markdown files asked for, atomically, and says where.
void write_reports(const ReportFiles& files, const tools::ReportInput& in);

}  // namespace tinygpt::cli
