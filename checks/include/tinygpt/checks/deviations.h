// Deviations an engine may declare in `hello` ("deviations": [...]): known ways real engines
// differ from our model on purpose (docs/checks.md, ../shared/ENGINES.md). A declared deviation is
// reported as such, never a silent pass: a row "declared: NAME" says what it relaxes, and every row
// it touches says so. Undeclared, the same difference fails. Unknown names are reported and relax
// nothing.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tinygpt::checks {

struct Deviation {
  std::string name;                 // as an engine declares it
  std::string what;                 // one line
  std::vector<std::string> checks;  // the rows it touches
  // The max |diff| those rows are judged by when it is declared, with the run that justified it; no
  // bound: a failing touched row is reported as declared (skipped, with what was seen) instead.
  std::optional<double> tolerance;
  // The self check's bound when it is declared (the deviation itself turns fp32 noise into larger
  // steps in one path and not the other); no bound: self is not relaxed.
  std::optional<double> self_tolerance;
  std::string evidence;
};

const std::vector<Deviation>& known_deviations();
// nullptr when `name` is not known.
const Deviation* find_deviation(const std::string& name);

}  // namespace tinygpt::checks
