// The main job, `tinygpt verify`, as a library call: on a model (the shipped fixture by default),
// every production cache through every model check at batch 1 (prompt ids [1, 2, 3]: the default
// set, the serving checks and batch sizes 1-8, 15-17 and 31-33) and at a batch of three different prompts; the fault matrix (every fault through every check, the
// production caches as negative controls); every golden case through every production cache; and
// the seed's sampler self-check. Returns the rows and the matrix; the caller prints and exits.
// Independent runs go side by side on the CPU (parallel_runs.h): one per intra-op thread.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/checks/inject.h"
#include "tinygpt/checks/kv_cost.h"
#include "tinygpt/checks/results.h"

namespace tinygpt::checks {

struct VerifyOptions {
  c10::Device device{c10::kCPU};
  int64_t tokens = 600;  // greedy tokens of each production cache's main run
  bool require_batch_invariance = false;  // batch-sizes fails on any difference from a row alone
  bool require_thread_invariance = false;  // thread-counts fails on any difference from 1 thread
  // The |diff| bound of the logit rows (default kLogitTolerance, 1e-4: fp32 noise of the seed's model is
  // ~1e-6). fp32 noise grows with a model's logits and depth: a model whose logits reach the hundreds
  // differs from itself at another batch shape by a few 1e-4 (docs/perf.md).
  std::optional<double> tolerance;
  // Every run inside the context (the rows that must go past it are skipped, saying "--quick"): on a model
  // of a long context the past-window rows' runs are thousands of steps, each judged against a full forward.
  bool inside_context = false;
  // The faults of the matrix; nullopt: every registered fault (an empty list: none).
  std::optional<std::vector<const CacheVariant*>> faults;
  // Only these rows of the check table (empty: every row the production caches run). A fault runs
  // the selected rows among its own; one whose catching rows are all left out is left out with them.
  // std::invalid_argument naming a name that is not such a row.
  std::vector<std::string> checks;
  // Each fault through every row of its own set (the cross-coverage matrix: which other rows also
  // catch it; about three times the matrix's time). Default: through the rows that must catch it and
  // `tokens` (the greedy run the others share), which is what the verdict gates on.
  bool full_matrix = false;
  // Also the rows of statistical power (Tag::Deep: spec-distribution's chi-square draws, minutes on two
  // cores); left out by default, saying so.
  bool deep = false;
  std::function<void(const std::string&)> progress;  // one line at a time; may be called from several threads
};

struct VerifyReport {
  std::string subject;              // the model checked, for reports
  std::vector<CheckResult> rows;    // the summary: one row per cache run, the matrix, goldens, sampler
  InjectionReport matrix;           // every fault's checks, drift and per-step differences
  std::vector<EquivalenceResult> budgeted;  // each low-precision cache's logit rows, judged by its KL budget
  // Each low-precision cache's cost per position: its teacher-forced run against the same arithmetic
  // with an fp32 cache (the series' cache at the variant's kernels) and against the fp32 model.
  std::vector<KvCost> kv;
  bool goldens_found = false;       // golden files were there for this model
  bool passed() const { return all_ok(rows); }
};

// `fx.dir` may be empty or hold no goldens: the golden rows are then left out (said by progress).
VerifyReport run_verify(Fixture& fx, const VerifyOptions& opts);

// One summary row for a target's run of the model checks: the seed's figure and the worst logit
// difference, or the first check that failed or erred; its status the worst of them.
CheckResult summary_row(const EquivalenceResult& r, const std::string& name);

}  // namespace tinygpt::checks
