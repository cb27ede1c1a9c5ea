// Deviations an engine may declare in `hello` ("deviations": [...]): known ways real engines
// differ from our model on purpose (docs/checks.md, docs/engines.md). A declared deviation is
// reported as such, never a silent pass: a row "declared: NAME" says what it relaxes, and every row
// it touches says so. Undeclared, the same difference fails. Unknown names are reported and relax
// nothing.
//
// Which rows a deviation touches is derived from the check table: every row judged one of the ways
// it names (and carrying its scope's tags), plus rows it names outright. A name the table does not
// have is refused when the table of deviations is first built.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tinygpt/checks/check_suite.h"

namespace tinygpt::checks {

struct Deviation {
  std::string name;  // as an engine declares it
  std::string what;  // one line
  // The rows it touches: those judged one of these ways whose tags include all of `scope`, and the
  // rows named in `checks`.
  std::vector<Judge> judges;
  Tags scope = 0;
  std::vector<std::string> checks;
  // The max |diff| the touched rows (other than Self rows) are judged by when it is declared, with
  // the run that justified it; no bound: a failing touched row is reported as declared (skipped,
  // with what was seen) instead.
  std::optional<double> tolerance;
  // The bound of touched Self rows (the deviation itself turns fp32 noise into larger steps in one
  // path and not the other); no bound: self is not relaxed.
  std::optional<double> self_tolerance;
  std::string evidence;
  // The mean KL per step the touched rows are judged by instead of max |diff| (unless the run set
  // --max-kl): for a difference that moves every logit of a step alike (log-probabilities answered
  // for logits), which |diff| would count and the distribution never sees.
  std::optional<double> max_kl;
  // Rows the deviation leaves nothing to judge by (a comparison it changes in kind, not in size): a
  // failure there is reported as declared.
  std::vector<std::string> voids;
  // The engine's semantics past the context are its own (a cache that never trims, on purpose): the run
  // stays inside the window, as with --no-past-window; the rows that prove nothing there (the touched
  // ones) are skipped saying the deviation's name, the others stop at the window's edge.
  bool inside_window = false;

  bool touches(const CheckDef& def) const;
  // The names of the rows it touches, in table order.
  std::vector<std::string> touched() const;
};

const std::vector<Deviation>& known_deviations();
// nullptr when `name` is not known.
const Deviation* find_deviation(const std::string& name);
// std::invalid_argument when `d` names a check the table does not have, or touches no row.
void validate_deviation(const Deviation& d);
// "gelu-tanh, rope-angle-recurrence, top-k-exact".
std::string deviation_names();

}  // namespace tinygpt::checks
