// Golden outputs with provenance: the fixture's sample grid, 600-token greedy runs (cached and
// uncached), the sampler self-check draws, and per-step logit digests (top-5 ids and logits).
// Tolerance policy: tokens exact on the same LibTorch version, device, dtype, threads and CPU;
// elsewhere a divergence is accepted only at a near-tie (each side's token in the other's top 2).
// Logit digests must agree within 1e-3 everywhere before any divergence.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/golden_compare.h"
#include "tinygpt/checks/reference.h"
#include "tinygpt/checks/results.h"
#include "tinygpt/gpt.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::checks {

// The source tree's commit (short hash), or "unknown" outside a git checkout.
std::string git_commit();


// This machine and build, for a document computed now on `device` with sampling seed `seed`.
Provenance current_provenance(c10::Device device, uint64_t seed);

// A model, its tokenizer, and the folder its golden files live in.
struct Fixture {
  GPT model{nullptr};
  Tokenizer tokenizer{{}};
  std::string dir;
  // <dir>/draft.safetensors where it is there and shares the model's vocabulary: the speculative rows'
  // trained draft (golden/draft: two layers, trained on the fixture's corpus and tokenizer).
  GPT draft{nullptr};
};
// The shipped fixture: <dir>/fixture.safetensors and <dir>/tokenizer.json onto `device`.
Fixture load_fixture(const std::string& dir, c10::Device device);
// Any model: a checkpoint (.pt or .safetensors) and its tokenizer, goldens in `golden_dir`.
Fixture load_fixture(const std::string& checkpoint, const std::string& tokenizer, const std::string& golden_dir,
                     c10::Device device);


// Every golden file's JSON, freshly computed (file name -> document). With `variant`, only the
// cached cases, through that cache (the files are recorded through the series' rolling cache).
// `uncached`, when given, is an equivalence reference of the same greedy run (ids [1, 2, 3], 600
// tokens, this model) whose uncached ids and logits are reused instead of recomputed.
// `cases` (sample-grid, greedy-600, sampler-selfcheck) computes only those; empty: every one.
std::vector<std::pair<std::string, nlohmann::json>> compute_goldens(Fixture& fx, c10::Device device,
                                                                   const CacheVariant* variant = nullptr,
                                                                   const Reference* uncached = nullptr,
                                                                   const std::vector<std::string>& cases = {});
// Compares the files in fx.dir with a fresh computation (through `variant` when given: its case
// names then end in " [name]"). One row per case, e.g. "sample-grid/top-p 0.9": the first mismatch
// (position, expected, actual, text around) or the figure; the largest logit difference as its value.
// `cases` as for compute_goldens (std::invalid_argument naming an unknown one).
std::vector<CheckResult> verify_goldens(Fixture& fx, c10::Device device, const CacheVariant* variant = nullptr,
                                             const Reference* uncached = nullptr, const std::vector<std::string>& cases = {});
// The golden cases, by the name their file records: sample-grid, greedy-600, sampler-selfcheck.
const std::vector<std::string>& golden_cases();
// Rewrites the golden files atomically; returns one line per file saying what changed.
std::vector<std::string> update_goldens(Fixture& fx, c10::Device device);

}  // namespace tinygpt::checks
