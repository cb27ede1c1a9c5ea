// The name of every row of the model check table, written once. The table's rows, the faults'
// expected lists and anything else that refers to a check by name use these, so a misspelt name is
// a compile error; the table refuses a row whose name is not unique, and the registry a fault naming
// a check the table does not have. Sampler rows are named "sampler/<law>" after the laws
// (tinygpt/laws/sampler_laws.h).
#pragma once

namespace tinygpt::checks::check {

inline constexpr const char kTokens[] = "tokens";
inline constexpr const char kLogits[] = "logits";
inline constexpr const char kWindowReference[] = "window-reference";
inline constexpr const char kReset[] = "reset";
inline constexpr const char kTeacherForced[] = "teacher-forced";
inline constexpr const char kSampled[] = "sampled";
inline constexpr const char kLongPrompt[] = "long-prompt";
inline constexpr const char kBatch[] = "batch";
inline constexpr const char kSelf[] = "self";
inline constexpr const char kRagged[] = "ragged";
inline constexpr const char kJoinLeave[] = "join-leave";
inline constexpr const char kFork[] = "fork";
inline constexpr const char kRollback[] = "rollback";
inline constexpr const char kBatchSizes[] = "batch-sizes";
inline constexpr const char kChunkedPrefill[] = "chunked-prefill";
inline constexpr const char kThreadCounts[] = "thread-counts";
inline constexpr const char kPrefixReuse[] = "prefix-reuse";
inline constexpr const char kSharedPrefix[] = "shared-prefix";
inline constexpr const char kChurn[] = "churn";
inline constexpr const char kSaveRestore[] = "save-restore";
inline constexpr const char kContextShift[] = "context-shift";
inline constexpr const char kReuseAfterShift[] = "reuse-after-shift";
inline constexpr const char kReusePastWindow[] = "reuse-past-window";
inline constexpr const char kRollbackAfterRestore[] = "rollback-after-restore";
inline constexpr const char kServed[] = "served";
inline constexpr const char kSpecGreedy[] = "spec-greedy";
inline constexpr const char kSpecSeeded[] = "spec-seeded";
inline constexpr const char kSpecStops[] = "spec-stops";
inline constexpr const char kSpecCache[] = "spec-cache";
inline constexpr const char kSpecDistribution[] = "spec-distribution";

// The prefix of every sampler row's name.
inline constexpr const char kSamplerPrefix[] = "sampler/";

}  // namespace tinygpt::checks::check
