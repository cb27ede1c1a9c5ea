// CPU against another device (CUDA) on one checkpoint and prompt. Logits are compared by normalised
// mean squared error, sum((a - b)^2) / sum(a^2) per position, as llama.cpp's backend tests compare
// backends: different kernels round differently, so equality is the wrong test and a relative error
// is the right scale. Greedy tokens must agree up to the first near-tie (each device's token in the
// other's top 2 there); after it the sequences part and are no longer compared.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/gpt.h"

namespace tinygpt::tools {

// float32 noise across devices is ~1e-12 to 1e-10 in NMSE; a wrong kernel is >= 1e-4.
constexpr double kNmseTolerance = 1e-6;

struct CrossDeviceResult {
  std::string device, cache;
  int64_t prompt_len = 0, tokens = 0;
  std::vector<double> forward_nmse;  // full forward over the CPU's sequence, per position
  std::vector<double> loop_nmse;     // each device's production loop, per step up to the first difference
  double worst_forward = 0, worst_loop = 0;
  std::optional<int64_t> first_difference;  // index in the sequence where the greedy tokens part
  bool near_tie = true;                     // the tokens part at a near-tie (or never part)
  double margin_at_difference = 0;          // CPU top1 - top2 there
  bool passed() const;
};

// cpu and other hold the same weights; prompt (1, T0) on the CPU.
CrossDeviceResult cross_device(GPT& cpu, GPT& other, const at::Tensor& prompt, int64_t tokens, const checks::CacheVariant& cpu_cache,
                               const checks::CacheVariant& other_cache);
std::string format_cross_device(const CrossDeviceResult& r);

}  // namespace tinygpt::tools
