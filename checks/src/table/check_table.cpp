// The model check table: one row per check, the one place a check is described. Everything else is
// derived from these rows - the default set, `--checks` and its help, conform's selection, the rows a
// declared deviation touches, the fault matrix's columns, the kit's test cases, docs/checks.md's
// tables (`tinygpt checks --markdown`). A row names its run function, declared here and defined in
// a file of its own in this folder (or with its family: model_rows.cpp, serving_rows.cpp).
#include <set>
#include <stdexcept>

#include "rows.h"

namespace tinygpt::checks {

// model_rows.cpp
void tokens_check(CheckContext&, CheckResult&);
void logits_check(CheckContext&, CheckResult&);
void window_reference_check(CheckContext&, CheckResult&);
void reset_check(CheckContext&, CheckResult&);
void teacher_forced_check(CheckContext&, CheckResult&);
void sampled_check(CheckContext&, CheckResult&);
void long_prompt_check(CheckContext&, CheckResult&);
void batch_check(CheckContext&, CheckResult&);
void self_check(CheckContext&, CheckResult&);
// serving_rows.cpp
void ragged_check(CheckContext&, CheckResult&);
void join_leave_check(CheckContext&, CheckResult&);
void fork_check(CheckContext&, CheckResult&);
void rollback_check(CheckContext&, CheckResult&);
void batch_sizes_check(CheckContext&, CheckResult&);
// chunked_prefill.cpp
void chunked_prefill_check(CheckContext&, CheckResult&);
// thread_counts.cpp
void thread_counts_check(CheckContext&, CheckResult&);
// prefix_reuse.cpp, churn.cpp, and shared-prefix with its family in serving_rows.cpp
void prefix_reuse_check(CheckContext&, CheckResult&);
void shared_prefix_check(CheckContext&, CheckResult&);
void churn_check(CheckContext&, CheckResult&);
// save_restore.cpp
void save_restore_check(CheckContext&, CheckResult&);
// context_shift.cpp
void context_shift_check(CheckContext&, CheckResult&);
// served.cpp
void served_check(CheckContext&, CheckResult&);

namespace {

std::vector<CheckDef> make_table() {
  const Tags in_default = static_cast<Tags>(Tag::Default);
  const Tags past = Tag::Default | Tag::PastWindow;
  const Tags serving = Tag::Serving | Tag::PastWindow;
  std::vector<CheckDef> t = {
      {check::kTokens, "the first context - prompt_len greedy tokens equal the uncached run's (the seed's 253)", tokens_check,
       in_default, Judge::Tokens, "", Cost::Shared,
       "any of the first context - prompt_len new tokens differing; names the position and the reference's top-2 margin there"},
      {check::kLogits, "every step's logits inside the window equal the full forward's, within the tolerance", logits_check,
       in_default, Judge::Reference, "", Cost::Shared, "|diff| over the tolerance at any step inside the window"},
      {check::kWindowReference,
       "every step's logits, past the window too, equal the banded (rolling-cache) reference's (query i sees keys "
       "i-context..i)",
       window_reference_check, past | Tag::OnlyPastWindow, Judge::Reference, "", Cost::Shared,
       "past-window bugs: a cache trimmed early or never, wrapped or clamped positions"},
      {check::kReset, "after another sequence, the first prompt gives the first run's logits again", reset_check, in_default,
       Judge::Repeat, "", Cost::Run, "a cache or loop that does not start fresh"},
      {check::kTeacherForced,
       "the harness's own loop (reset, prefill, step) over the reference sequence matches both references: the cache alone",
       teacher_forced_check, past, Judge::Reference, "", Cost::Run, "a cache bug, apart from the target's own loop bookkeeping"},
      {check::kSampled,
       "a seeded run with every sampler stage on matches the references, hands the sampler the whole history, and "
       "draws what the sampler draws on the reference logits",
       sampled_check, past, Judge::Reference, "", Cost::Run,
       "loop bugs that show only when sampling: the history the penalty sees"},
      {check::kLongPrompt,
       "a prompt longer than the window (context + 44 ids) is prefilled from its last context tokens; later steps match",
       long_prompt_check, past | Tag::OnlyPastWindow, Judge::Reference, "", Cost::Run,
       "a prefill from the wrong offset, positions past the window"},
      {check::kBatch,
       "different prompts in one batch: each row equals its sequence alone (batch 1, uncached), inside and past the "
       "window, its ids the greedy choice of those logits, row 0 the main run",
       batch_check, past, Judge::Reference, "", Cost::Run, "rows mixed or shifted in the cache, a row handed another row's token", 3},
      // Our own caches: `logits` already compares every cached step with the full forward, which is our
      // prefill; `self` is for targets that are not our model (conform).
      {check::kSelf,
       "each cached step inside the window equals the target's own prefill of the same tokens (the target's "
       "approximations cancel; only its cache can part them)",
       self_check, static_cast<Tags>(Tag::EngineOnly), Judge::Self, "", Cost::Runs,
       "a cache bug in an engine that is not bit-exact with our model; a bug both paths share passes it"},
      {check::kRagged,
       "rows of different prompt lengths (3, 9, 17) in one batch each equal their sequence alone, inside and past the window",
       ragged_check, serving, Judge::Reference, "ragged", Cost::Run, "positions counted from the padded length", 3},
      {check::kJoinLeave,
       "a row leaving and another joining a running batch change no row: each equals its sequence alone", join_leave_check,
       serving, Judge::Reference, "join", Cost::Run, "a joined row stepped at the batch's position, a freed slot reused unreset", 2},
      {check::kFork,
       "a row forked early and again far past the window (its entries moved): parent and children continue apart, each "
       "equal to its sequence alone",
       fork_check, serving, Judge::Reference, "fork", Cost::Run,
       "a fork sharing storage with its parent, a fork that loses where the parent's live entries begin", 3},
      {check::kRollback,
       "drafts rolled back inside the window, across its edge and past it leave the sequence without them", rollback_check,
       serving, Judge::Reference, "truncate", Cost::Run,
       "a rollback one entry off, one that cannot bring back the entries a draft pushed out of the window"},
      {check::kBatchSizes,
       "batch sizes 1-8, 15-17 and 31-33 (bucket edges): every row within the tolerance of itself alone; bitwise "
       "invariance measured",
       batch_sizes_check,
       static_cast<Tags>(Tag::Serving), Judge::Invariance, "", Cost::Runs,
       "a row over the tolerance from itself alone; with --require-batch-invariance, any difference"},
      {check::kChunkedPrefill,
       "a prompt prefilled in chunks (1, 2, 7, 16, 64 and an odd split) equals the one-pass prefill and the reference at "
       "every chunk's end and after; a row extended by several tokens after generating equals the reference",
       chunked_prefill_check, static_cast<Tags>(Tag::Serving), Judge::Reference, "extend", Cost::Run,
       "a chunk's positions restarting at the chunk, the last generated token missing from the cache"},
      {check::kThreadCounts,
       "the same greedy run at 1 thread, 2 and every core available: within the tolerance of 1 thread; bitwise "
       "invariance measured",
       thread_counts_check, 0, Judge::Invariance, "threads", Cost::Runs,
       "a cache or kernel that races between threads; with --require-thread-invariance, any difference"},
      {check::kPrefixReuse,
       "prompts sharing 1 to all of a left row's tokens (the whole prompt, and one more), each admitted beside a miss: "
       "every row equals its sequence alone, however much the target reused (the row says how much)",
       prefix_reuse_check, static_cast<Tags>(Tag::Serving), Judge::Reference, "ragged,join", Cost::Run,
       "a reused prefix at the wrong positions or one entry too long (the last prompt token not computed again), the old "
       "row's entries left visible", 2},
      {check::kSharedPrefix,
       "rows sharing a 96-token prefix with tails of their own, in one batch: each equals its sequence alone",
       shared_prefix_check, static_cast<Tags>(Tag::Serving), Judge::Reference, "ragged", Cost::Run,
       "a shared prefix served to the wrong row or at the wrong positions (cascade attention)", 3},
      {check::kChurn,
       "a seeded plan of 200 operations (admit, step, fork, rollback, extend, context shift, save, restore, release; up "
       "to 8 rows live): every row, live or gone, equals its sequence alone (a shifted row: the model's own entries "
       "shifted the same way) at every position it showed",
       churn_check, serving, Judge::Reference, "join", Cost::Run,
       "cache-layout bugs that need churn: a slot freed out of order, a position kept by request instead of by row, a "
       "released row's entries left visible, a shift that moves entries another row still shares", 8},
      {check::kSaveRestore,
       "a row saved as a value inside and past the window, restored beside live rows, after a reset, after churn and "
       "into a second instance of the target (an engine's second process): each continues as the saved row did",
       save_restore_check, serving, Judge::Reference, "save", Cost::Run,
       "a state saved in part, a restored row positioned by its cache's length, a restore into a slot not made fresh, a "
       "state that refers to the saving process's memory", 4},
      {check::kContextShift,
       "a row that fills the window shifted three times (the entries after the first 4 halved, the later ones renumbered "
       "and their keys re-rotated), 32 steps after each: equals the uncached model's own keys and values shifted by "
       "RoPE's formula, the error after each shift reported",
       context_shift_check, static_cast<Tags>(Tag::Serving), Judge::Reference, "ragged,shift", Cost::Run,
       "kept keys not re-rotated, a row's position not moved down, a re-rotation whose error grows with each shift"},
      // Engines that schedule their own requests: our model has none (its rows are driven directly above).
      {check::kServed,
       "requests the engine schedules itself (mixed lengths, staggered arrivals, prefix reuse after a finished request, a "
       "long prompt beside decoding rows, forks): every sequence it returns is the greedy run of its own prompt alone, its "
       "logits (or top-N log-probabilities) within the bound",
       served_check, Tag::Serving | Tag::EngineOnly, Judge::Reference, "generate", Cost::Runs,
       "a scheduler that mixes up requests, a batch's padding or positions leaking into a row, a stale or too-long cached "
       "prefix, a chunk of a split prompt at the wrong positions, forks sharing blocks they write"},
  };
  std::set<std::string> names;
  for (const auto& c : t) {
    if (!names.insert(c.name).second) throw std::logic_error("check table: duplicate name " + c.name);
    if (c.proves.empty() || c.catches.empty() || !c.run) throw std::logic_error("check table: row " + c.name + " is incomplete");
  }
  return t;
}

}  // namespace

const std::vector<CheckDef>& model_checks() {
  static const std::vector<CheckDef> table = make_table();
  return table;
}

}  // namespace tinygpt::checks
