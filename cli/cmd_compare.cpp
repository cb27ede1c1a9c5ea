// `tinygpt compare OLD.json NEW.json`: two reports of the same checks, row by row, for gating an
// upgrade in CI (checks/include/tinygpt/checks/compare.h).
#include <fstream>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "tinygpt/checks/compare.h"
#include "tinygpt/errors.h"
#include "tinygpt/results/result.h"

namespace tinygpt::cli {

namespace {
nlohmann::json read_report(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open the report");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InputError(path + ": not valid JSON");
  return j;
}
}  // namespace

Command add_compare(CLI::App& app) {
  struct Opts {
    std::string old_path, new_path, json;
    checks::CompareOptions compare;
    bool all = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Compare two reports of the same checks (what `verify`, `conform` or `equivalence` wrote with --json): which\n"
      "rows changed verdict, which figures moved and by how much (worst |diff|, KL, top-1; for verify also each\n"
      "production cache's rows and each fault's verdict). Exits 1 when any row got worse: a verdict that no longer\n"
      "passes, a row no longer run, a figure past --margin. How a team gates an engine or cache upgrade in CI:\n"
      "  tinygpt compare shipped.json candidate.json --margin 0.5");
  cmd->add_option("OLD", o->old_path, "the report to compare against (the version you ship)")->required()->check(CLI::ExistingFile);
  cmd->add_option("NEW", o->new_path, "the report of the candidate")->required()->check(CLI::ExistingFile);
  cmd->add_option("--margin", o->compare.margin,
                  "a figure is worse when NEW > OLD x (1 + margin) + floor (default 1: it may double)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--floor", o->compare.floor, "figures closer than this never count as moved (fp32 noise)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top1-drop", o->compare.top1_drop, "top-1 agreement is worse when it falls by more than this fraction")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--allow-missing", o->compare.allow_missing, "a row OLD has that NEW does not run is not counted as worse");
  cmd->add_flag("--all", o->all, "print every row, not only the ones that changed");
  cmd->add_option("--json", o->json, "also write the comparison as JSON here");
  return {cmd, [o] {
            const auto c = checks::compare_reports(read_report(o->old_path), read_report(o->new_path), o->compare, o->old_path,
                                                   o->new_path);
            std::cout << checks::format_comparison(c, o->all);
            if (!o->json.empty()) results::write_json_atomically(o->json, checks::to_json(c));
            return c.passed() ? int(kOk) : int(kCheckFailed);
          }};
}

}  // namespace tinygpt::cli
