// An int8 KV cache: the rolling cache's semantics (SPEC 4: attend to the window and the new entries,
// trim after attending, kRollbackEntries kept for a rollback) with every key and value stored as
// int8 and one float scale per token per head, for K and for V apart: scale = absmax over the head's
// channels / 127, q = round(x / scale). Attention reads the entries dequantized (q * scale), the new
// ones too, as a quantized cache in a real engine does (the new token is written first, then read).
// 1 byte per value plus 4 per (token, head) of K and of V: SPEC's formula at 1 byte per value, plus
// the scales (bytes()).
//
// Not bit-exact with the fp32 model by design: it is judged by a KL budget (the variant's
// kv_budget), not by the fp32 bound. The protected hooks are where its planted faults differ.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tinygpt/kv_cache.h"

namespace tinygpt {

struct Config;

class Int8KVCache : public KVCache {
 public:
  Int8KVCache(int64_t n_layers, int64_t context);
  explicit Int8KVCache(const Config& cfg);

  // k, v (B, H, T, hd) float32. Returns the dequantized keys and values the queries see (B, H, S, hd).
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  void reset() override;
  int64_t length() const override;
  int64_t bytes() const override;           // the window's int8 values and their scales
  int64_t capacity_bytes() const override;  // everything held, the rollback entries too
  std::string row_ops_unsupported() const override { return ""; }
  std::unique_ptr<KVCache> clone() const override;
  void truncate(int64_t n) override;
  std::string save_unsupported() const override { return ""; }
  // Dequantized (a restore or a shift quantizes them again: q * scale quantizes back to q).
  std::pair<at::Tensor, at::Tensor> stored(int64_t layer) const override;

  // x (B, H, T, hd) float -> q (B, H, T, hd) int8 and scale (B, H, T, 1) float, x ~ q * scale: the
  // production quantization (absmax per token per head, round to nearest; an all-zero row gets scale 1).
  struct Quantized {
    at::Tensor q, scale;
  };
  static Quantized quantize(const at::Tensor& x);
  // x quantized with the given scale (B, H, T, 1): q = round(x / scale) (trunc: toward zero), clamped to +-127.
  static Quantized quantize_with(const at::Tensor& x, const at::Tensor& scale, bool trunc = false);
  static at::Tensor absmax_scale(const at::Tensor& x);  // (B, H, T, 1)

 protected:
  // The new keys' and values' quantization; `layer`'s stored entries (scales_k(layer) ...) are
  // there for a hook that reads them.
  virtual Quantized quantize_k(int64_t layer, const at::Tensor& k, const at::Tensor& v) const;
  virtual Quantized quantize_v(int64_t layer, const at::Tensor& k, const at::Tensor& v) const;
  // An empty cache of the same kind (clone copies the entries into it).
  virtual std::unique_ptr<Int8KVCache> make_empty() const;
  // The scales of the stored keys, (B, H, S, 1); undefined when empty.
  const at::Tensor& stored_k_scale(int64_t layer) const { return ks_.at(static_cast<size_t>(layer)); }
  const at::Tensor& stored_v_scale(int64_t layer) const { return vs_.at(static_cast<size_t>(layer)); }
  int64_t layers() const { return static_cast<int64_t>(kq_.size()); }
  int64_t window() const { return context_; }

 private:
  int64_t context_;
  // per layer: q (B, H, S, hd) int8 and scales (B, H, S, 1) float, S <= context + kRollbackEntries
  std::vector<at::Tensor> kq_, vq_, ks_, vs_;
};

}  // namespace tinygpt
