// A preallocated KV cache with the series' semantics (SPEC 4): per layer, K and V buffers sized
// once per sequence and written in place, so a decode step allocates nothing for the cache
// (the series' torch.cat rebuilds every layer's cache each step: ~50 MB a step at batch 16).
// A decode step still attends to context+1 keys and the cache keeps the last `context` after.
//
// Layout: each buffer holds 2 x context + 1 slots (at least context + kRollbackEntries + 1); live entries sit in order
// at [begin, begin + length), the newest `context` of them the window and the older ones kept for a
// rollback. New entries are written after them; when the buffer's end is reached the live entries
// are copied back to slot 0 (once every ~context steps). So the keys a query sees are a contiguous,
// ordered slice, in the same order as the rolling cache's.
// Leaves out paging and per-row lengths: every row of a batch shares one length (serving.h gives
// each sequence a cache of its own).
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
  std::string row_ops_unsupported() const override { return ""; }
  std::unique_ptr<KVCache> clone() const override;
  void truncate(int64_t n) override;
  std::string save_unsupported() const override { return ""; }
  std::pair<at::Tensor, at::Tensor> stored(int64_t layer) const override;

  // The fused decode step's way in (fused_step.h): room for one new entry per (row, head) of
  // `layer`, CPU float32, with the same bookkeeping as update(). The caller writes the new key and
  // value of plane p = b * H + h at k/v + p * plane + slot * hd, then reads the `seen` keys it
  // attends to at k/v + p * plane + from * hd onwards (consecutive, hd floats apart). Valid until
  // the next append or update of the layer.
  struct RawAppend {
    float* k = nullptr;
    float* v = nullptr;
    int64_t plane = 0, slot = 0, from = 0, seen = 0;
  };
  RawAppend append_one(int64_t layer, int64_t B, int64_t H, int64_t hd);

 private:
  // Makes room for T entries in `layer` (allocating, compacting or growing) and returns the slot
  // they go to; commit() then counts them and returns (first slot attended, keys attended).
  int64_t reserve(int64_t layer, int64_t B, int64_t H, int64_t T, int64_t hd, const at::TensorOptions& opts);
  std::pair<int64_t, int64_t> commit(int64_t layer, int64_t T);

  struct Layer {
    at::Tensor k, v;         // (B, H, capacity, hd), undefined until the first update
    int64_t begin = 0, len = 0;
  };
  int64_t context_;
  std::vector<Layer> layers_;
};

}  // namespace tinygpt
