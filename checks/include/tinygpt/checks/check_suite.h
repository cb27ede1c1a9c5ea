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

#include "tinygpt/checks/check_names.h"
#include "tinygpt/checks/judge.h"
#include "tinygpt/checks/ops.h"
#include "tinygpt/checks/reference.h"
#include "tinygpt/checks/results.h"
#include "tinygpt/checks/target.h"
#include "tinygpt/sampler.h"

namespace tinygpt::checks {

// A field added here is added to options_key (below) too: results kept between processes are keyed by it.
struct EquivalenceOptions {
  at::Tensor prompt;     // (B, T0) int64; longer than the context is allowed (SPEC 4 feeds the last context)
  int64_t tokens = 600;  // greedy new tokens of the main run
  // The batch check: rows of different prompts (row b = the prompt shifted by b ids) when the
  // prompt has one row, and new tokens (0: min(tokens, context + 32), past the window).
  int64_t batch_rows = 3;
  int64_t batch_tokens = 0;
  int64_t batch_stride = 1;  // row b = the prompt + b x stride (mod V)
  // The sampled check: a seeded run with every sampler stage active (0 tokens: as batch_tokens).
  SamplingSettings sampling = SamplingSettings::every_stage();
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
  // The self check compares every self_stride-th decode step inside the window (and the last); 0:
  // the first 16, every 16th, the 8 more of smallest top-2 margin and the last (rows.h).
  int64_t self_stride = 0;
  // batch-sizes fails on any difference between a row in a batch and the row alone, not only on one
  // over the tolerance.
  bool require_batch_invariance = false;
  // batch-sizes: the batch sizes it runs, ascending (empty: 1-8, 15-17 and 31-33, where engines' kernels and
  // captured graphs change shape at 16 and 32). Sizes past the target's own row limit are left out, saying so.
  std::vector<int64_t> batch_sizes;
  // thread-counts: the counts it runs at (empty: 1, 2 and the cores available), and whether any
  // difference from the first count fails, not only one over the tolerance.
  std::vector<int> thread_counts;
  bool require_thread_invariance = false;
  // false: the target is never driven past the context (its long-sequence semantics are its own):
  // the past-window checks are skipped, saying so, and the caller keeps `tokens` inside the window.
  bool past_window = true;
  // Why past_window is false, as the skipped rows say it: "--no-past-window", or "declared no-window"
  // (an engine whose long-sequence semantics are its own, on purpose).
  std::string inside_window_why = "--no-past-window";
  // Held-out runs (--vary N): 0 runs every serving row as documented; N > 0 another churn plan (seed
  // kChurnSeed + N), other prompt lengths and ids in the serving rows and another context-shift keep,
  // so positions and magnitudes move while the operations stay. The same N replays the same run.
  uint64_t variation = 0;
  // The speculative rows' trained draft (a small model sharing the target's vocabulary, golden/draft):
  // their "model" drafts; none: those runs are skipped, saying so. Keyed by its weights' digest.
  GPT draft{nullptr};
  // spec-distribution's draws (0: the count sized for its stated power, speculative.cpp in the table).
  int64_t spec_draws = 0;
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
  std::string tolerance_reason = kLogitToleranceReason;  // why that bound (the options' Tolerances::why, when set)
  at::Tensor produced;     // (B, T0 + tokens) the target's greedy output
  std::vector<CheckResult> checks;
  bool main_attempted = false;  // a check asked for the target's main greedy run (drift can be measured)
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

// Row tags: which sets a check belongs to. Every selection of checks is derived from them.
enum class Tag : unsigned {
  Default = 1u << 0,       // the default set: `tinygpt equivalence`, each fault's run, the kit's cases
  Serving = 1u << 1,       // what serving engines do to a cache (rows joining, forking, rolling back, batch sizes)
  PastWindow = 1u << 2,    // drives the target past the context when the run is long enough
  OnlyPastWindow = 1u << 3,  // proves nothing inside the window: skipped, saying so, with --no-past-window
  NeedsScores = 1u << 4,   // reads a sampler's filtered scores: never run on an engine seen through `sample`
  EngineOnly = 1u << 5,    // for targets that are not our model: our own caches' runs leave it out
  Sampler = 1u << 6,       // a row of the sampler table
  Budget = 1u << 7,        // a low-precision cache's logit rows in verify, judged by its KL budget
  Long = 1u << 8,          // a serving row that runs long (far past the window, many operations): a serving
                           // fault runs it only when it is the row the fault must be caught by
  Deep = 1u << 9,          // statistical power that costs minutes: `verify --deep`, conform and ctest run it,
                           // plain `verify` leaves it out, saying so
};
using Tags = unsigned;
constexpr Tags operator|(Tag a, Tag b) { return static_cast<Tags>(a) | static_cast<Tags>(b); }
constexpr Tags operator|(Tags a, Tag b) { return a | static_cast<Tags>(b); }
constexpr bool has(Tags tags, Tag t) { return (tags & static_cast<Tags>(t)) != 0; }
// "default, past-window": the tags' names, for listings.
std::string tag_names(Tags tags);

// How a row is judged: which bound applies, and so which declared deviations may relax it.
enum class Judge {
  Tokens,      // greedy ids identical to the uncached run's (no logit bound)
  Reference,   // logits against our reference model: max |diff| <= the tolerance, or --max-kl / --min-top1
  Self,        // the target's cached steps against its own prefill: max |diff| <= the self tolerance
  Repeat,      // the target against its own earlier run of the same input: max |diff| <= the tolerance
  Invariance,  // a row in a batch against the same row alone on the target: max |diff| <= the tolerance
  Law,         // a sampler law or fixed check: its formula holds
};
// "reference tolerance", "self tolerance", ...: what judges a row of this kind.
std::string judge_text(Judge j);

// What a row costs beyond the references every row shares.
enum class Cost {
  Shared,  // reads the target's main greedy run (made once for every row that needs it)
  Run,     // one run of its own: tens to hundreds of steps
  Runs,    // many runs: a prefill per step, or a run per batch size
  Law,     // a property: RapidCheck's cases through the sampler
};
const char* cost_name(Cost c);

struct CheckDef {
  std::string name;    // unique; reports, --checks and the fault table use it (check_names.h)
  std::string proves;  // one line: what a pass means
  std::function<void(CheckContext&, CheckResult&)> run;
  Tags tags = 0;
  Judge judge = Judge::Reference;
  // The serving operations the row drives (ops.h; DecodeTarget::unsupported): the row is skipped,
  // saying why, on a target without one of them. Empty: none.
  Ops ops;
  Cost cost = Cost::Run;
  std::string catches;  // one line: the bugs a failure points to, for the docs and `tinygpt checks`
  // The most rows it drives at once: skipped, saying so, on a target that takes fewer
  // (DecodeTarget::max_rows: an engine that keeps one sequence, wllama's).
  int64_t rows = 1;
  bool is(Tag t) const { return has(tags, t); }
};

// The bounds in force for one row, after any declared deviation relaxed them.
struct RowBound {
  Tolerances tol;
  std::vector<std::string> relaxed_by;   // deviations that set a wider bound for this row
  std::vector<std::string> declared_by;  // deviations that touch this row but give it no bound
};

struct Deviation;

// Everything a check may read, and the figures it may leave. The reference and the target's main
// greedy run are made once, by the first check that needs them.
class CheckContext {
 public:
  // `shared`, when given, is build_reference(model, opts) made by the caller for several targets.
  // The target's declared deviations (DecodeTarget::deviations) that this suite knows relax the
  // bounds of the rows they touch (deviations.h).
  CheckContext(GPT& model, const EquivalenceOptions& opts, DecodeTarget& target, EquivalenceResult& out,
               const Reference* shared = nullptr);
  GPT& model;
  const EquivalenceOptions& opts;
  DecodeTarget& target;
  EquivalenceResult& out;

  const Reference& ref();
  // The target's greedy run from opts.prompt, opts.tokens long (a target that takes whole requests only:
  // its own plain run through speculate, logits undefined where it gives top-N only). Throws when it could not be made
  // (the first check that asked for it carries the reason; later ones say "see <that check>").
  const Generation& main();
  // The references over the main run's own sequence (the shared ones when it equals the uncached run).
  const StepReference& main_reference();
  bool have_main() const { return main_.has_value(); }

  // The row being run and the bounds it is judged by (set by run_check).
  const CheckDef& row() const;
  const Tolerances& tol() const { return bound_.tol; }
  // The bounds `def` is judged by here: opts.tolerance, relaxed by the declared deviations touching it.
  RowBound bound_for(const CheckDef& def) const;
  const std::vector<const Deviation*>& declared() const { return declared_; }
  // Where a long row is (a line at a time, "row: what"), when the runner shows progress; unset, silent.
  std::function<void(const std::string&)> progress;

 private:
  friend CheckResult run_check(const CheckDef& def, CheckContext& ctx);
  const Reference* shared_;
  std::optional<Reference> own_ref_;
  std::optional<Generation> main_;
  std::optional<std::string> main_error_;  // the check whose run failed
  std::optional<StepReference> main_ref_;
  const CheckDef* row_ = nullptr;
  RowBound bound_;
  std::vector<const Deviation*> declared_;
};

// The model checks, in the order they run: the default set first, then self, then the serving
// checks (check_table.cpp).
const std::vector<CheckDef>& model_checks();
// The sampler checks through the target's `pick`: sampler/<law> for every law that holds for a
// sampler seen through its draws, and sampler/<fixed check>.
const std::vector<CheckDef>& sampler_checks();
// Every check name of both tables, in order.
std::vector<std::string> check_names();
// The row of `name` in either table; std::invalid_argument listing the names when unknown.
const CheckDef& find_check(const std::string& name);
// The names of the model checks whose tags include every tag of `all` and none of `none`, in order.
std::vector<std::string> model_checks_with(Tags all, Tags none = 0);
// The serving checks that drive an operation on rows of our model (CheckDef::op; not the engine-only ones), in order.
std::vector<std::string> row_operation_checks();
// "tokens, logits, ...": the model check names for an option's --help, with what the default runs.
std::string model_check_list();

// Throws std::invalid_argument naming the first bad option.
void validate(const EquivalenceOptions& opts);
// Every field of `opts` as text: what a result kept between processes is keyed by (a field added to
// EquivalenceOptions is added here too).
std::string options_key(const EquivalenceOptions& opts);
// cached_reference(model, opts.prompt, opts.tokens) after validate(opts) (reference.h: computed here
// unless TINYGPT_REFERENCE_CACHE holds it).
Reference build_reference(GPT& model, const EquivalenceOptions& opts);

// Runs the named checks of either table (the default set of model checks when `names` is empty).
EquivalenceResult run_checks(GPT& model, const EquivalenceOptions& opts, DecodeTarget& target,
                             const std::vector<std::string>& names = {}, const Reference* shared = nullptr);
// The options a variant is judged by: a low-precision cache's (kv_budget) mean-KL budget unless the
// options already set one.
EquivalenceOptions judged_as(const EquivalenceOptions& opts, const CacheVariant& variant);
// Our model through one cache variant, every model check: `tinygpt equivalence`, and each run of
// the fault matrix.
EquivalenceResult check_equivalence(GPT& model, const EquivalenceOptions& opts, const Reference& ref,
                                    const CacheVariant& variant);
// Runs one check guarded: an exception becomes an error row. Skips a row whose operation the target
// lacks or that only shows past the window when the run stays inside it; applies the row's bound
// (CheckContext::bound_for) and says in the row which declared deviation set it.
CheckResult run_check(const CheckDef& def, CheckContext& ctx);

// Console lines for one target's run (the seed's two lines first) and one line per check.
std::string format_equivalence(const EquivalenceResult& r);

}  // namespace tinygpt::checks
