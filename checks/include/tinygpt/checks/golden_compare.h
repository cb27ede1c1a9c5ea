// The comparison half of the goldens: a recorded golden document against a freshly computed one,
// and the reader of recorded files. Needs no model, only the tokenizer (to show text around a
// mismatch), so it is also what fuzz/fuzz_golden.cpp drives.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tinygpt/checks/results.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::checks {

// Logit digests agree within this everywhere before any divergence (the tolerance policy: golden.h).
constexpr double kDigestTolerance = 1e-3;
constexpr const char* kDigestToleranceReason =
    "fp32 logits differ by ~1e-5 across thread counts and BLAS builds; a model or cache change moves them by >= 1e-2";
// A divergence is accepted at a near-tie: each side's token in the other's top kNearTieTopN.
constexpr int kNearTieTopN = 2;
constexpr int kDigestTop = 5;  // logits recorded per step: the top 5 ids and their values

// Where a golden document was computed. Tokens must be exact in the same environment; elsewhere a
// divergence is accepted at a near-tie. current_provenance (golden.h) reads this machine's.
struct Provenance {
  std::string commit, libtorch, device, dtype = "float32";
  std::string cpu;  // the CPU model: BLAS kernels (and their rounding) differ between CPUs
  std::string blas;  // the OpenBLAS core the products ran on ("" where a file predates it: not compared)
  int threads = 1;
  uint64_t seed = 1;
  nlohmann::json to_json() const;
  static Provenance from_json(const nlohmann::json& j);
  bool same_environment(const Provenance& o) const;
};

// A recorded golden file, parsed; InputError naming `path` when it is missing or not JSON.
nlohmann::json read_golden_json(const std::string& path);

// Every field of a recorded golden document that the comparison reads, with its type: InputError
// naming `path` and the field when one is missing or malformed. Costs nothing beside the minutes
// of recomputing, so a broken file is named before them.
void validate_golden_document(const std::string& path, const nlohmann::json& want, const Tokenizer& tok);

// The cases of one golden document: `want` as recorded at `path`, `fresh` as computed now (trusted).
// Case names get `suffix`; with `cached_only` (another cache recomputes only the cached rows),
// recorded rows that were not recomputed are not reported. InputError naming `path` when the
// recorded document lacks a field or has one of the wrong type.
std::vector<CheckResult> compare_golden_document(const std::string& path, const nlohmann::json& want,
                                                      const nlohmann::json& fresh, const Tokenizer& tok,
                                                      const std::string& suffix, bool cached_only);

}  // namespace tinygpt::checks
