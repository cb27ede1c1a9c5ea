// A KV cache laid out for CUDA graphs: per layer, a ring of context + 1 slots for K and V whose
// shape and address never change during a sequence. A graph replays a captured step with one
// launch only if every shape and address stays fixed, which the series' concatenating cache cannot
// give. Entries sit in the ring out of order once it wraps; a decode query has no mask and attention
// does not depend on the keys' order (only the rounding of its sums does), so after the wrap a step
// attends to all context + 1 slots: the rolling cache's context stored plus the new one (SPEC 4).
// This file is storage only; the graph decode that reads the rings is graph_step.h.
// Leaves out prefills on a non-empty cache: the generation loop never does that.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tinygpt/kv_cache.h"

namespace tinygpt {

struct Config;

class RingKVCache final : public KVCache {
 public:
  explicit RingKVCache(const Config& cfg);

  // A prefill (empty cache, T <= context tokens) or one token per call. Returns the filled slots,
  // (B, H, S, hd) views into the rings.
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  void reset() override;
  int64_t length() const override;
  int64_t bytes() const override;
  int64_t capacity_bytes() const override;
  std::string row_ops_unsupported() const override {
    return "the CUDA graph's ring holds a fixed context + 1 slots per sequence: no room to keep entries for a rollback";
  }

  int64_t context() const { return context_; }
  int64_t layers() const { return static_cast<int64_t>(k_.size()); }
  // Layer l's rings (B, H, context + 1, hd); undefined before the first prefill.
  at::Tensor& ring_k(int64_t l) { return k_.at(static_cast<size_t>(l)); }
  at::Tensor& ring_v(int64_t l) { return v_.at(static_cast<size_t>(l)); }
  // Tokens stored in total since the last reset (the next one goes to slot fed % (context + 1)).
  int64_t fed() const { return fed_.front(); }
  // Records one token written into every layer's ring by someone else (a replayed graph).
  void advance();

 private:
  int64_t context_;
  std::vector<at::Tensor> k_, v_;  // per layer (B, H, context + 1, hd)
  std::vector<int64_t> fed_;       // per layer: tokens stored in total
};

}  // namespace tinygpt
