// The decode step replayed from a CUDA graph: a second implementation of the cached step, beside
// the model's reference step (decode_step.h), bound to one RingKVCache. The seed found its cached
// GPU step no faster than the CPU's: one decode step launched ~317 small kernels and the GPU idled
// ~80% of the step. Here one decode step (every layer and the head, ~20 kernels a layer) is captured
// once per batch size and replayed with one launch; its RoPE position and the ring's fill live in
// device tensors filled before each replay, so the graph itself never changes.
//
// Prefills, and every step off CUDA, go to the model's reference step through the same ring.
// Implements the production attention policy only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "tinygpt/decode_step.h"
#include "tinygpt/ring_kv_cache.h"

namespace tinygpt {

class GraphStep final : public StepFunction {
 public:
  explicit GraphStep(RingKVCache& ring);
  ~GraphStep() override;

  // A decode step (T = 1) on CUDA into a ring that holds a prefill of the same batch replays the
  // graph (capturing it on first use); anything else is the reference step. `cache` must be the
  // ring this step was made for (std::logic_error otherwise).
  at::Tensor operator()(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, Kernels kernels) override;

  // The captured function run without a graph, on any device: the same arithmetic, so CPU tests
  // check the graph path's step. idx (B, 1) at RoPE position `position` -> (B, V).
  at::Tensor eager(GPTImpl& model, const at::Tensor& idx, int64_t position);
  // Graphs captured so far (a batch size or model change captures anew).
  int64_t captures() const { return captures_; }

 private:
  struct Graph;
  // Checks the ring is ready for a decode step and fills the static inputs (allocated per batch).
  void prepare(GPTImpl& model, const at::Tensor& idx, int64_t position);
  at::Tensor replay(GPTImpl& model, const at::Tensor& idx, int64_t position);
  RingKVCache& ring_;
  std::unique_ptr<Graph> graph_;
  int64_t captures_ = 0;
};

}  // namespace tinygpt
