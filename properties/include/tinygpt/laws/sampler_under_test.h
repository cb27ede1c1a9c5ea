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

struct SamplerUnderTest {
  std::string name;
  std::string description;
  ScoreFn filtered;  // (B, V) scores that `pick` draws from; temperature > 0
  ScoreFn pick;      // (B) ids
};

SamplerUnderTest production_sampler();
std::vector<SamplerUnderTest> planted_bugs();

}  // namespace tinygpt::props
