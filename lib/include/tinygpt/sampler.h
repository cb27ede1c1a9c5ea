// The series' sampler `pick` (SPEC 6) as separate stages, each usable and testable alone:
// penalty -> temperature (0 = argmax) -> top-k -> top-p -> draw. Every stage works on a float32
// (B, V) score tensor and returns a new one; none mutates its input.
// Leaves out min-p, typical sampling and beam search: the series has none of them.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tinygpt/generate.h"

namespace tinygpt {

struct SamplingSettings {
  double temperature = 1.0;  // 0 = greedy (argmax); must be >= 0
  int64_t top_k = 0;         // 0 = off; must be >= 0
  double top_p = 1.0;        // 1 = off; must be in (0, 1]
  double penalty = 1.0;      // 1 = off; must be > 0

  // Throws std::invalid_argument naming the bad setting.
  void validate() const;
  std::string to_string() const;
  // Every stage active at once: temperature 0.8, top-k 40, top-p 0.9, penalty 1.3 (the golden grid's
  // last row; the harness's sampled run).
  static SamplingSettings every_stage();
};

// Checks logits (B, V) floating with no NaN/+inf and at least one finite score per row, and
// history (B, T) int64 ids in [0, V) with the same B (an undefined history is allowed).
// Throws std::invalid_argument. Returns a float32 contiguous copy of the logits.
at::Tensor checked_scores(const at::Tensor& logits, const at::Tensor& history);

// 1. For each DISTINCT id in a row's history: s -> s / penalty if s > 0 else s * penalty.
//    Dividing a negative score would raise it, so negatives are multiplied: both push it down.
at::Tensor apply_penalty(const at::Tensor& scores, const at::Tensor& history, double penalty);
// 2. scores / temperature (temperature > 0).
at::Tensor apply_temperature(const at::Tensor& scores, double temperature);
// 3. Every score strictly below the k-th largest becomes -inf; ties with the k-th survive.
at::Tensor apply_top_k(const at::Tensor& scores, int64_t k);
// 4. Sorted descending (equal scores by index, lower first), a token is dropped (-inf) when the
//    probability mass ranked above it already reaches top_p. The top token always survives.
at::Tensor apply_top_p(const at::Tensor& scores, double top_p);
// 5. One id per row from softmax(scores) with multinomial: (B, V) -> (B). Without `gen`, on
//    LibTorch's default generator, so torch::manual_seed(s) reproduces Python's
//    torch.manual_seed(s) draws. With `gen` (see make_generator), on that generator alone: two
//    threads sampling at once then cannot take each other's random numbers.
at::Tensor draw(const at::Tensor& scores, const c10::optional<at::Generator>& gen = c10::nullopt);

// A generator of its own for `device`, seeded with `seed`: its draws equal those of the default
// generator after manual_seed(seed) (CPU: the same Mersenne twister; CUDA: the same Philox stream).
at::Generator make_generator(c10::Device device, uint64_t seed);

// One row's sampler state in a batch, as a serving engine keeps it per request: its own settings and
// its own seed (none: the row draws from fresh entropy, reproducible by nobody).
struct RowSampling {
  SamplingSettings settings;
  std::optional<uint64_t> seed;
};

// The pipeline of SPEC 6 as data: each stage is one member, so a test can replace exactly one of
// them (the property suite's planted bugs do) and keep the order and every other stage. The
// production sampler below is production_stages().
struct SamplerStages {
  std::function<at::Tensor(const at::Tensor& scores, const at::Tensor& history, double penalty)> penalty = apply_penalty;
  std::function<at::Tensor(const at::Tensor& scores, double temperature)> temperature = apply_temperature;
  std::function<at::Tensor(const at::Tensor& scores, int64_t k)> top_k = apply_top_k;
  std::function<at::Tensor(const at::Tensor& scores, double top_p)> top_p = apply_top_p;
  // Temperature 0: the first index of the largest score, per row, (B, V) -> (B).
  std::function<at::Tensor(const at::Tensor& scores)> argmax = [](const at::Tensor& x) { return x.argmax(-1); };

  // Stages 1 and 3-4 with the temperature of stage 2 (> 0): the scores `draw` uses, (B, V).
  at::Tensor filtered(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) const;
  // The whole sampler: (B) ids; temperature 0 is argmax after the penalty.
  at::Tensor pick(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s,
                  const c10::optional<at::Generator>& gen = c10::nullopt) const;
  // Rows with sampler states of their own: row b drawn `n` times with rows[b].settings from a generator
  // of its own seeded with rows[b].seed, so its draws depend on nothing but its own logits, history,
  // settings and seed - never on its neighbours, their seeds or its place in the batch.
  // logits (B, V), history (B, T) or undefined, rows.size() == B -> (B, n) int64.
  at::Tensor pick_rows(const at::Tensor& logits, const at::Tensor& history, const std::vector<RowSampling>& rows, int64_t n) const;
};
const SamplerStages& production_stages();

// Stages 1 and 3-4 with the temperature of stage 2 (which must be > 0): the scores `draw` uses.
at::Tensor filtered_scores(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s);
// softmax(filtered_scores): the probability of each id under `pick`, (B, V) float32.
at::Tensor filtered_probs(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s);

// The whole sampler: logits (B, V), history (B, T) or undefined -> ids (B) int64.
at::Tensor pick(const at::Tensor& logits, const SamplingSettings& s, const at::Tensor& history = {},
                const c10::optional<at::Generator>& gen = c10::nullopt);

// SamplerStages::pick_rows of the production stages.
at::Tensor pick_rows(const at::Tensor& logits, const at::Tensor& history, const std::vector<RowSampling>& rows, int64_t n);

// `pick` as a generation callback; the generation loop's history is the whole sequence so far.
// With `gen`, every draw comes from it (one stream across the steps).
TokenChooser sampler(const SamplingSettings& s, c10::optional<at::Generator> gen = c10::nullopt);

}  // namespace tinygpt
