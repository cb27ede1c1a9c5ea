// The comparison half of the goldens: a recorded golden document against a freshly computed one,
// and the reader of recorded files. Needs no model, only the tokenizer (to show text around a
// mismatch), so it is also what fuzz/fuzz_golden.cpp drives.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tinygpt/checks/golden.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::checks {

constexpr int kDigestTop = 5;  // logits recorded per step: the top 5 ids and their values

// A recorded golden file, parsed; InputError naming `path` when it is missing or not JSON.
nlohmann::json read_golden_json(const std::string& path);

// The cases of one golden document: `want` as recorded at `path`, `fresh` as computed now (trusted).
// Case names get `suffix`; with `cached_only` (another cache recomputes only the cached rows),
// recorded rows that were not recomputed are not reported. InputError naming `path` when the
// recorded document lacks a field or has one of the wrong type.
std::vector<CheckResult> compare_golden_document(const std::string& path, const nlohmann::json& want,
                                                      const nlohmann::json& fresh, const Tokenizer& tok,
                                                      const std::string& suffix, bool cached_only);

}  // namespace tinygpt::checks
