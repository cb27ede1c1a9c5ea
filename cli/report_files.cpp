#include "report_files.h"

#include <fstream>
#include <iostream>

#include "tinygpt/tools/bench.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/atomic_file.h"
#include "tinygpt/errors.h"

namespace tinygpt::cli {

nlohmann::json read_bench_json(const std::string& path) {
  if (path.empty()) return nullptr;
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open the bench report");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("rows") || !j["rows"].is_array())
    throw InputError(path + ": not a `tinygpt bench --json` report (expected an object with \"rows\")");
  for (const auto& r : j["rows"])
    if (!r.is_object() || !r.contains("cached_tok_s") || !r["cached_tok_s"].is_number())
      throw InputError(path + ": a bench row without a number \"cached_tok_s\"");
  return j;
}

nlohmann::json report_provenance(c10::Device device) {
  const auto m = tools::MachineInfo::current(device);
  return {{"commit", checks::git_commit()}, {"libtorch", m.libtorch}, {"blas", m.blas}, {"blas_core", m.blas_core},
          {"kernels", m.kernels}, {"device", m.device}, {"threads", m.threads}, {"cpu", m.cpu}};
}

nlohmann::json with_provenance(nlohmann::json report, c10::Device device) {
  report["provenance"] = report_provenance(device);
  return report;
}

void write_reports(const ReportFiles& files, const tools::ReportInput& in) {
  if (!files.html.empty()) {
    write_text_atomically(files.html, tools::render_html(in));
    std::cerr << in.command << ": HTML report " << files.html << "\n";
  }
  if (!files.markdown.empty()) {
    write_text_atomically(files.markdown, tools::render_markdown(in));
    std::cerr << in.command << ": Markdown summary " << files.markdown << "\n";
  }
}

}  // namespace tinygpt::cli
