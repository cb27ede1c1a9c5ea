// JSON views of the harness's result structs (schemas documented in the README).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tinygpt/checks/equivalence.h"
#include "tinygpt/checks/inject.h"

namespace tinygpt::checks {

nlohmann::json to_json(const StepDiffs& d);
nlohmann::json to_json(const EquivalenceResult& r);
nlohmann::json to_json(const InjectionReport& r);

// Writes `doc` to `path` through a temporary file renamed into place: never a half-written file.
void write_json_atomically(const std::string& path, const nlohmann::json& doc);

}  // namespace tinygpt::checks

namespace tinygpt::checks {

// Text escaped for XML and HTML (& < > "), control characters other than newline and tab as spaces.
std::string xml_escape(const std::string& s);

// One row of `tinygpt verify`'s summary: the console table, the JSON report and the JUnit XML
// are three views of a list of these.
struct VerifyRow {
  std::string check;
  bool passed = true;
  std::string figure;  // the key figure, or what failed
  double seconds = 0;
};

// The table and a last line "<command>: all N checks passed" or "<command>: FAILED (k of N checks)".
std::string format_verify_table(const std::vector<VerifyRow>& rows, const std::string& command = "verify");
nlohmann::json to_json(const std::vector<VerifyRow>& rows);
// JUnit XML (one testsuite, one testcase per row), written atomically.
void write_junit(const std::string& path, const std::vector<VerifyRow>& rows);

}  // namespace tinygpt::checks
