// The seed's sampler self-check (SPEC 6), against any pick function so the property suite can
// run it on planted bugs too: temperature 0, top_k=1 and top_p=1e-9 equal argmax; top_k=5 never
// leaves the top 5 (200 draws); top_p=0.75 over [0.5, 0.3, 0.15, 0.05] draws only {0, 1}, both
// (500 draws); penalty 2.0 on [2.0, 1.5] with history [0] at temperature 0 picks 1.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <vector>

#include "tinygpt/sampler.h"

namespace tinygpt::checks {

using PickFn = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings&)>;

struct SelfCheckItem {
  std::string name;
  bool passed = true;
  std::string detail;           // what went wrong, or the figure
  std::vector<int64_t> draws;   // the ids drawn, for goldens
};

std::vector<SelfCheckItem> sampler_selfcheck(const PickFn& pick, c10::Device device);
PickFn production_pick();

}  // namespace tinygpt::checks
