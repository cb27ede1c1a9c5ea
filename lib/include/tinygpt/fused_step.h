// The CPU decode step as one function over raw buffers: the `static` cache's step. The model's own
// step (GPTImpl::step with Kernels::Decode) makes ~15 LibTorch calls a layer - views, splits,
// transposes, allocations, the cache's copies - which at batch 1 on one thread cost close to half
// a step (`tinygpt bench --profile`; docs/perf.md). This step runs the same
// kernels (kernels_raw.h: the same products, norms, RoPE, attention and GELU, in the same order)
// on preallocated scratch, writing the new keys and values straight into the StaticKVCache it is
// bound to, so its logits equal the model's Decode step bit for bit (tests/lib/test_fused_step.cpp).
//
// Takes one-token steps of 1 to kMatvecMaxRows rows, float32 on the CPU, Kernels::Decode, the
// production attention policy; anything else (a prefill, a GPU, Kernels::Library) is the model's
// own step, unchanged. Not thread-safe: one step function per decoder, as the registry makes them.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "tinygpt/decode_step.h"

namespace tinygpt {

class StaticKVCache;

// Where the fused step's time goes, timed inside real steps (a clock read between parts, ~20 ns
// each): `tinygpt bench --profile` reads it. Timed alone, a part finds its weights and keys in cache;
// inside a step they come from memory, which is the time a user's decode pays.
struct FusedStepProfile {
  enum Part { Embedding, Norms, QkvProducts, OutProducts, UpProducts, DownProducts, HeadProduct, RopeAndCache, Attention, kParts };
  static const char* name(Part p);
  std::array<double, kParts> seconds{};
  int64_t steps = 0;  // fused steps timed (one-token steps; a prefill is the model's step, not counted)
};

class FusedCpuStep final : public StepFunction {
 public:
  explicit FusedCpuStep(StaticKVCache& cache) : cache_(cache) {}
  // idx (B, T) at positions start.. through `cache` (the one bound) -> (B, V).
  at::Tensor operator()(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, Kernels kernels) override;
  // Adds each part's time of every later fused step to *p (null: no timing, the default).
  void set_profile(FusedStepProfile* p) { profile_ = p; }

 private:
  StaticKVCache& cache_;
  std::vector<float> scratch_;
  FusedStepProfile* profile_ = nullptr;
};

}  // namespace tinygpt
