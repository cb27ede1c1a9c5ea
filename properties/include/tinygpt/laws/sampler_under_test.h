// What the sampler laws are checked against: a pipeline of sampler stages. The production sampler
// is one; the planted bugs (planted_bugs.cpp) are others, each with exactly one stage wrong, so
// the suite can prove it catches them while lib/ keeps no bug branches.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "tinygpt/sampler.h"

namespace tinygpt::props {

using ScoreFn = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& history,
                                         const SamplingSettings& s)>;
// A batch whose rows carry sampler states of their own (settings and seed): (B, n) ids.
using RowsFn = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& history,
                                        const std::vector<RowSampling>& rows, int64_t n)>;

struct SamplerUnderTest {
  std::string name;
  std::string description;
  ScoreFn filtered;  // (B, V) scores that `pick` draws from; temperature > 0
  ScoreFn pick;      // (B) ids
  RowsFn pick_rows;  // per-row settings and seeds; empty where the sampler has one setting per batch
};

SamplerUnderTest production_sampler();
// Each with exactly one stage wrong, as a real bug report had it; every one must be caught.
// The last of them keep every stage and get only the per-row state of a batch wrong (pick_rows).
std::vector<SamplerUnderTest> planted_bugs();
// Samplers that differ from ours only where SPEC 6 leaves the choice open (the order among equal
// scores at the nucleus boundary): every law and fixed check must pass them.
std::vector<SamplerUnderTest> legal_variants();

}  // namespace tinygpt::props
