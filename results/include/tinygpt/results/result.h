// The one result every check, golden case and sampler item returns, and the printers over a list
// of them (the console table, JSON, JUnit XML, Markdown; the HTML page is the tools library's).
// Four verdicts, because a user acts on each differently:
//   pass     the check ran and what it proves holds;
//   fail     the check ran and found the target wrong (the only verdict that counts as a fault caught);
//   error    the check could not finish: the target (or a dependency) threw, or did not answer;
//   skipped  the check does not apply to this target (said why in the detail); never a failure.
// Leaves out per-step data (the plots draw it from the equivalence results themselves).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tinygpt::results {

enum class Status { Pass, Fail, Error, Skipped };

// "pass", "fail", "error", "skipped"; and back (std::invalid_argument on anything else).
const char* to_string(Status s);
Status status_from_string(const std::string& s);

struct CheckResult {
  std::string name;
  Status status = Status::Pass;
  std::string detail;             // one line: the key figure, or what failed and where
  std::optional<double> figure;   // the key number (a worst |diff|, a count), when there is one
  double seconds = 0;             // wall time
  std::string bound;              // which bound judged it, e.g. "max |diff| <= 1e-04"
  std::map<std::string, double> stats;  // precision statistics and other named figures
  // Named facts that are words, not numbers: a failing serving row's signature (the operation the first
  // divergence followed, where it started; diagnose.h reads them), as JSON "labels".
  std::map<std::string, std::string> labels;

  bool ok() const { return status == Status::Pass || status == Status::Skipped; }
  bool failed() const { return status == Status::Fail; }
};

// A check that threw: its status is error and its detail the first line of the message.
CheckResult error_result(const std::string& name, const std::string& message, double seconds = 0);

// True when no row failed or erred.
bool all_ok(const std::vector<CheckResult>& rows);
// The worst status of `rows` (error > fail > pass > skipped); pass for an empty list.
Status worst(const std::vector<CheckResult>& rows);

// The table and a last line "<command>: all N checks passed (k skipped)" or "<command>: FAILED (...)".
std::string format_table(const std::vector<CheckResult>& rows, const std::string& command);
// {"passed", "counts": {...}, "checks": [{"check", "status", "passed", "figure", "value", ...}]}:
// "figure" is the detail line and "value" the key number (docs/reports.md).
nlohmann::json to_json(const std::vector<CheckResult>& rows);
nlohmann::json to_json(const CheckResult& r);
// JUnit XML: one testcase per row; fail -> <failure>, error -> <error>, skipped -> <skipped>.
std::string junit_xml(const std::vector<CheckResult>& rows, const std::string& suite);
// A Markdown table of the rows (for CI step summaries).
std::string markdown_table(const std::vector<CheckResult>& rows);
// Writes `doc` to `path` through a temporary file renamed into place: never a half-written file.
void write_json_atomically(const std::string& path, const nlohmann::json& doc);

// Text escaped for XML and HTML (& < > "), and every sequence XML 1.0 does not allow as U+FFFD.
std::string xml_escape(const std::string& s);

// The well-formed UTF-8 character at s[i]: its length in bytes (1-4) with its code point in `cp`,
// or 0 where the bytes there are not one (invalid, overlong, a surrogate, past U+10FFFF, truncated).
size_t utf8_char(const std::string& s, size_t i, uint32_t& cp);
// "1.23e-04".
std::string sci(double v);
// The items with `sep` between them: "a, b, c".
std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");

}  // namespace tinygpt::results
