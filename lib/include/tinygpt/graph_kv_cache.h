// A KV cache laid out for CUDA graphs. The seed found its cached GPU step no faster than the CPU's:
// one decode step launched ~317 small kernels and the GPU idled ~80% of the step. A graph replays a
// captured step with one launch, but only if every shape and address stays fixed, so here:
//  - per layer a ring of context + 1 K/V slots: a decode step always attends over the whole ring,
//    with a mask of the filled slots (the rolling cache's context + 1 keys once the window is full);
//  - the step's RoPE position and the number of tokens stored live in device tensors, filled
//    before each replay, so the graph itself never changes.
// On CUDA, GPT::step with Kernels::CudaGraph and the production attention policy captures one decode
// step (every layer and the head) per batch size and replays it; everywhere else the same ring runs
// eagerly through the ordinary layers. Keys sit in the ring out of order; a decode query has no mask
// and attention does not depend on the keys' order (only the rounding of its sums does).
// Leaves out prefills on a non-empty cache: the generation loop never does that.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tinygpt/kv_cache.h"

namespace tinygpt {

struct Config;
class GPTImpl;

class GraphKVCache final : public KVCache {
 public:
  explicit GraphKVCache(const Config& cfg);
  ~GraphKVCache() override;

  // A prefill (empty cache, T <= context tokens) or one token per call. Returns the filled slots,
  // (B, H, S, hd) views into the rings.
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  void reset() override;
  int64_t length() const override;
  int64_t bytes() const override;
  int64_t capacity_bytes() const override;

  // One decode step of `model` for idx (B, 1) on CUDA at RoPE position `position`, replayed from a
  // CUDA graph captured on first use (and again when the batch or the model changes). (B, V).
  // Throws std::runtime_error where LibTorch has no CUDA.
  at::Tensor decode(GPTImpl& model, const at::Tensor& idx, int64_t position);
  // The captured function run without a graph, on any device: the same arithmetic, so the CPU
  // tests check the graph path's step. (B, V).
  at::Tensor decode_eager(GPTImpl& model, const at::Tensor& idx, int64_t position);
  // Graphs captured so far (a batch size or model change captures anew).
  int64_t captures() const { return captures_; }

 private:
  struct Graph;
  // Checks the ring is ready for a decode step and fills the static inputs (allocated per batch).
  void prepare(GPTImpl& model, const at::Tensor& idx, int64_t position);
  int64_t n_layers_, context_;
  std::vector<at::Tensor> k_, v_;  // per layer (B, H, context + 1, hd), undefined until the first prefill
  std::vector<int64_t> fed_;       // per layer: tokens stored in total (slot of the next = fed % (context + 1))
  std::unique_ptr<Graph> graph_;
  int64_t captures_ = 0;
};

}  // namespace tinygpt
