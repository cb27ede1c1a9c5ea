// A preallocated KV cache with the series' semantics (SPEC 4): per layer, K and V buffers sized
// once per sequence and written in place, so a decode step allocates nothing for the cache
// (the series' torch.cat rebuilds every layer's cache each step: ~50 MB a step at batch 16).
// A decode step still attends to context+1 keys and the cache keeps the last `context` after.
//
// Layout: each buffer holds 2 x context + 1 slots (B, H, 2 x context + 1, hd); live entries sit
// in order at [begin, begin + length). New entries are written after them; when the buffer's end
// is reached the live entries are copied back to slot 0 (once every ~context steps). So the keys
// a query sees are a contiguous, ordered slice, in the same order as the rolling cache's.
// Leaves out paging and per-row lengths: every row of a batch shares one length, as in the series.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tinygpt/kv_cache.h"

namespace tinygpt {

struct Config;

class StaticKVCache final : public KVCache {
 public:
  explicit StaticKVCache(const Config& cfg);
  StaticKVCache(int64_t n_layers, int64_t context);

  // k, v: (B, H, T, hd). Returns views (B, H, S, hd) into the buffers, valid until the next
  // update of the same layer. Buffers are (re)allocated when a sequence starts or the batch,
  // heads, head size, dtype or device change.
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  void reset() override;
  int64_t length() const override;
  int64_t bytes() const override;
  int64_t capacity_bytes() const override;

 private:
  struct Layer {
    at::Tensor k, v;         // (B, H, capacity, hd), undefined until the first update
    int64_t begin = 0, len = 0;
  };
  int64_t context_;
  std::vector<Layer> layers_;
};

}  // namespace tinygpt
