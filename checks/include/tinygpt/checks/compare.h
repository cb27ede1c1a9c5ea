// Two reports of the same checks, row by row (`tinygpt compare OLD.json NEW.json`): which rows
// changed verdict, which figures moved and by how much, and whether any row got worse beyond a
// margin the user sets. This is how a team gates an engine or cache upgrade in CI: the report of
// the version they ship against the report of the one they want to ship.
//
// A report is what `verify`, `conform` or `equivalence` write with --json. Its rows: every row of
// "checks"; for verify also each production cache's own rows of the fault matrix ("rolling: churn")
// and each fault's verdict ("fault: " and its name). The figures compared: a row's value (its worst
// |diff|; for the fault matrix the faults caught) and the statistics the rows carry (max |diff|,
// KL mean and max: lower is better; top-1 agreement: higher is better).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace tinygpt::checks {

struct CompareOptions {
  // A lower-is-better figure got worse when new > old * (1 + margin) + floor: 1.0 lets it double.
  double margin = 1.0;
  // Figures closer than this never count as moved (fp32 noise across builds and thread counts).
  double floor = 1e-6;
  // Top-1 agreement got worse when it fell by more than this (a fraction of the steps).
  double top1_drop = 0.01;
  // A row of OLD that NEW does not run (absent, or skipped where it ran) counts as worse unless set.
  bool allow_missing = false;
};

struct RowChange {
  std::string row;
  std::string old_status, new_status;  // pass, fail, error, skipped, caught, missed; "" when absent
  std::vector<std::string> moved;      // "max |diff| 1.20e-05 -> 3.40e-03 (x283)", one per figure that moved
  bool worse = false, better = false;
  std::string why;                     // for a worse row: the first reason
};

struct Comparison {
  std::string kind;  // "verify", "conform", "equivalence": both reports' kind
  std::vector<RowChange> rows;  // OLD's rows in order, then the rows only NEW has
  CompareOptions options;
  std::string old_engine, new_engine;  // conform reports: the engines' names as their hello gave them
  int worse() const;
  int better() const;
  bool passed() const { return worse() == 0; }
};

// InputError (tinygpt/errors.h) naming `old_name` or `new_name` when one is not a report (no
// "checks" rows with a name and a status), or when they are reports of different kinds.
Comparison compare_reports(const nlohmann::json& old_report, const nlohmann::json& new_report, const CompareOptions& o = {},
                           const std::string& old_name = "OLD", const std::string& new_name = "NEW");

// The rows that changed (every row with `all_rows`) and a closing line with the verdict.
std::string format_comparison(const Comparison& c, bool all_rows = false);
nlohmann::json to_json(const Comparison& c);

}  // namespace tinygpt::checks
