// The check table: every check the harness runs, once, as a named function over a decode target
// and the references. `tinygpt equivalence`, `verify`, `conform` and the conformance kit all run
// rows of this table; adding a check is one function and one row (docs/ARCHITECTURE.md).
//
// A check reads the shared context (the reference model, the greedy reference, the options and
// the target), fills one CheckResult, and may leave figures in the EquivalenceResult for reports.
// An exception inside a check makes it an `error`, never a `fail`: a target that crashes is not a
// bug the check found.
#pragma once

#include <functional>
#include <stdexcept>
#include <optional>
#include <string>
#include <vector>

#include "tinygpt/checks/reference.h"
#include "tinygpt/checks/result.h"
#include "tinygpt/checks/target.h"
#include "tinygpt/sampler.h"

namespace tinygpt::checks {

// The bounds a check judges by. `logits` is max |diff| against our reference model; `self` is max
// |diff| of the target's cached step against its own prefill of the same tokens (both paths share
// every approximation the target makes, so only the cache can part them).
struct Tolerances {
  double logits = kLogitTolerance;
  double self = kSelfTolerance;
  std::optional<double> max_kl;    // gate on mean KL(reference || target) per step instead of max |diff|
  std::optional<double> min_top1;  // gate on the share of steps whose argmax agrees
};

struct EquivalenceOptions {
  at::Tensor prompt;     // (B, T0) int64; longer than the context is allowed (SPEC 4 feeds the last context)
  int64_t tokens = 600;  // greedy new tokens of the main run
  // The batch check: rows of different prompts (row b = the prompt shifted by b ids) when the
  // prompt has one row, and new tokens (0: min(tokens, context + 32), past the window).
  int64_t batch_rows = 3;
  int64_t batch_tokens = 0;
  int64_t batch_stride = 1;  // row b = the prompt + b x stride (mod V)
  // The sampled check: a seeded run with every sampler stage active (0 tokens: as batch_tokens).
  SamplingSettings sampling{0.8, 40, 0.9, 1.3};
  uint64_t sampling_seed = 1;
  int64_t sampled_tokens = 0;
  // The long-prompt check: a prompt of context + long_extra ids (fixed pseudo-random), then
  // long_tokens greedy steps.
  int64_t long_extra = 44;
  int64_t long_tokens = 24;
  // The reset check: steps compared after another sequence ran on the same target.
  int64_t reset_tokens = 32;
  // ragged, join-leave and fork: decode steps after the rows start, join or fork (0: until the
  // rows are 16 past the window). rollback always runs across the window's edge.
  int64_t serving_tokens = 0;
  // The self check compares every self_stride-th decode step inside the window (and the last).
  int64_t self_stride = 1;
  // batch-sizes fails on any difference between a row in a batch and the row alone, not only on one
  // over the tolerance.
  bool require_batch_invariance = false;
  // false: the target is never driven past the context (its long-sequence semantics are its own):
  // the past-window checks are skipped, saying so, and the caller keeps `tokens` inside the window.
  bool past_window = true;
  Tolerances tolerance;
};

// What one target's run of the model checks leaves behind, besides its rows.
struct EquivalenceResult {
  std::string cache;  // the target's name
  int64_t prompt_len = 0, tokens = 0, batch = 0, context = 0;
  int64_t must_match = 0;        // context - prompt_len (capped at tokens, >= 0)
  int64_t identical_prefix = 0;  // leading new tokens identical in every row
  std::optional<int64_t> first_difference;  // index in the full sequence (0-based)
  int64_t sequence_length = 0;
  std::optional<double> margin_at_difference;  // uncached top1 - top2 where the paths part
  std::vector<double> step_margins;  // per step: uncached top1 - top2 (min over rows)
  StepDiffs loop_full;     // the target's loop vs full forward, inside the window ("logits")
  StepDiffs loop_band;     // the target's loop vs banded reference, every step ("window-reference")
  StepDiffs forced_full;   // teacher-forced loop vs full forward, inside the window
  StepDiffs forced_band;   // teacher-forced loop vs banded reference, every step
  double tolerance = kLogitTolerance;
  at::Tensor produced;     // (B, T0 + tokens) the target's greedy output
  std::vector<CheckResult> checks;
  bool passed() const { return all_ok(checks); }
  const CheckResult* check(const std::string& name) const;
};

class CheckContext;

// Thrown inside a check (or by a target while a check drives it) when the target is demonstrably
// wrong - an answer of the wrong shape, a non-finite logit, an engine's `ok: false` to a valid
// request: the check fails with the message. Every other exception makes the check an error.
struct CheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CheckDef {
  std::string name;    // unique; reports, --checks and the fault table use it
  std::string proves;  // one line: what a pass means
  std::function<void(CheckContext&, CheckResult&)> run;
  // In the default set (`tinygpt equivalence`, the fault matrix, verify, the kit); conform runs all.
  bool in_default = true;
  // Reads a sampler's filtered scores, not only its draws: never run on an engine seen through `sample`.
  bool needs_scores = false;
};

// Everything a check may read, and the figures it may leave. The reference and the target's main
// greedy run are made once, by the first check that needs them.
class CheckContext {
 public:
  // `shared`, when given, is build_reference(model, opts) made by the caller for several targets.
  CheckContext(GPT& model, const EquivalenceOptions& opts, DecodeTarget& target, EquivalenceResult& out,
               const Reference* shared = nullptr);
  GPT& model;
  const EquivalenceOptions& opts;
  DecodeTarget& target;
  EquivalenceResult& out;

  const Reference& ref();
  // The target's greedy run from opts.prompt, opts.tokens long. Throws when it could not be made
  // (the first check that asked for it carries the reason; later ones say "see <that check>").
  const Generation& main(const std::string& asking_check);
  // The references over the main run's own sequence (the shared ones when it equals the uncached run).
  const StepReference& main_reference();
  bool have_main() const { return main_.has_value(); }

 private:
  const Reference* shared_;
  std::optional<Reference> own_ref_;
  std::optional<Generation> main_;
  std::optional<std::string> main_error_;  // the check whose run failed
  std::optional<StepReference> main_ref_;
};

// The model checks, in the order they run: tokens, logits, window-reference, reset, teacher-forced,
// sampled, long-prompt, batch (the default set), then self, and the serving checks: ragged,
// join-leave, fork, rollback, batch-sizes.
const std::vector<CheckDef>& model_checks();
// The sampler checks through the target's `pick`: sampler/<law> for every law that holds for a
// sampler seen through its draws, and sampler/<fixed check>.
const std::vector<CheckDef>& sampler_checks();
// Every check name of both tables, in order.
std::vector<std::string> check_names();
// The row of `name` in either table; std::invalid_argument listing the names when unknown.
const CheckDef& find_check(const std::string& name);

// Throws std::invalid_argument naming the first bad option.
void validate(const EquivalenceOptions& opts);
// build_reference(model, opts.prompt, opts.tokens) after validate(opts).
Reference build_reference(GPT& model, const EquivalenceOptions& opts);

// Runs the named checks of either table (the default set of model checks when `names` is empty).
EquivalenceResult run_checks(GPT& model, const EquivalenceOptions& opts, DecodeTarget& target,
                             const std::vector<std::string>& names = {}, const Reference* shared = nullptr);
// Our model through one cache variant, every model check: `tinygpt equivalence`, and each run of
// the fault matrix.
EquivalenceResult check_equivalence(GPT& model, const EquivalenceOptions& opts, const Reference& ref,
                                    const CacheVariant& variant);
// Runs one check guarded: an exception becomes an error row.
CheckResult run_check(const CheckDef& def, CheckContext& ctx);

// Console lines for one target's run (the seed's two lines first) and one line per check.
std::string format_equivalence(const EquivalenceResult& r);

}  // namespace tinygpt::checks
