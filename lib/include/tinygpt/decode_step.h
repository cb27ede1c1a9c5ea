// How a cached step is computed. The reference is GPTImpl::step: the model's own layers, one op
// after another. A fast variant computes the same function another way in a file of its own (the
// llm.c way: one clean reference, fast variants beside it) - graph_step.h replays a captured CUDA
// graph - and is chosen through the decode path, so neither the model nor any cache knows of it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "tinygpt/attention_policy.h"
#include "tinygpt/kernels.h"

namespace tinygpt {

class GPTImpl;
class KVCache;
struct DecodePath;

class StepFunction {
 public:
  virtual ~StepFunction() = default;
  // The contract of GPTImpl::step_unchecked: idx (B, T) at positions start .. start+T-1 through
  // `cache` -> (B, V) logits of the last position. A variant implements the production attention
  // policy only (the registry refuses a variant with both a step function and a policy of its own).
  virtual at::Tensor operator()(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, Kernels kernels) = 0;
};

// One cached step the way `path` says: its step function when it has one, else the model's own
// step with the path's attention policy and kernels. idx (B, T) -> (B, V). No id validation.
at::Tensor decode_step(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, const DecodePath& path);

}  // namespace tinygpt
