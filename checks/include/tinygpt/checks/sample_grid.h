// The seed's sample grid (SPEC 6): one checkpoint, one prompt, nine sampler settings, the sampling
// seed re-set before each row, cached generation on the CPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/gpt.h"
#include "tinygpt/sampler.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::checks {

struct GridSetting {
  std::string name;
  SamplingSettings settings;
};
const std::vector<GridSetting>& grid_settings();

struct GridRow {
  std::string name;
  SamplingSettings settings;
  std::vector<int64_t> ids;      // prompt + new tokens
  std::string text;
  std::vector<at::Tensor> logits;  // per new token: the model's raw logits (V) before the sampler
  std::string error;               // set when the sampler refused to go on (the row stops there)
};

// Generates every grid row from `prompt_ids` through `variant`'s cached path (the series' rolling
// cache when null); `keep_logits` records per-step logits. A row whose sampler throws keeps its
// error and the other rows still run.
std::vector<GridRow> sample_grid(GPT& model, const Tokenizer& tok, const std::vector<int64_t>& prompt_ids,
                                 uint64_t seed, int64_t tokens, bool keep_logits = false,
                                 const CacheVariant* variant = nullptr);

}  // namespace tinygpt::checks
