// The production decode path beside the plain reference (gpt.h): the model's cached step with the
// weight products, LayerNorms and one-query attention through our decode kernels (kernels.h), and
// the parameters packed in one block of huge pages. It computes GPTImpl::step's function another
// way - within float rounding, not bitwise (tests/lib/test_kernels.cpp, the fused-step tests and
// every check run on the `static` cache compare them) - and neither the model nor a cache knows of it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "tinygpt/attention_policy.h"
#include "tinygpt/kernels.h"

namespace tinygpt {

class GPTImpl;
class KVCache;

// GPTImpl::step_unchecked computed with `kernels`: Library is the model's own step; Decode runs the
// same layers with the decode kernels where the shapes suit them (kernels.h). idx (B, T) at positions
// start .. start+T-1 -> the last position's logits (B, V). No id validation.
at::Tensor step_with(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy,
                     Kernels kernels);
// GPTImpl::step_every computed with `kernels`: every position's logits, (B, T, V) (a speculative verify
// step: B x T rows up to kMatvecMaxRows go through the product kernel).
at::Tensor step_every_with(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy,
                           Kernels kernels);
// GPTImpl::step_at computed with `kernels`: rows at positions (B, T) of their own -> (B, V).
at::Tensor step_at_with(GPTImpl& model, const at::Tensor& idx, KVCache& cache, const at::Tensor& positions,
                        const AttentionPolicy& policy, Kernels kernels);
// GPTImpl::step_at_every computed with `kernels`: every column's logits, (B, T, V).
at::Tensor step_at_every_with(GPTImpl& model, const at::Tensor& idx, KVCache& cache, const at::Tensor& positions,
                              const AttentionPolicy& policy, Kernels kernels);

// Moves every CPU parameter into one block of huge pages (huge_pages.h) in the order a decode step
// reads them - each layer's parameters in registration order (norm1, qkv, out, norm2, up, down),
// the final norm, then the embedding the tied head reads last - so a batch-1 step streams one run
// of memory and the products' prefetch runs on across a matrix's end. Values are copied; the
// parameters stay ordinary tensors (views of the block), so a later move to a GPU moves them out.
// A model with a parameter off the CPU or not float32 is left as it is.
void pack_parameters(GPTImpl& model);

}  // namespace tinygpt
