// The int8 cache's faults (int8_kv_cache.h): each a real way a quantized cache goes wrong, each
// judged, as the cache is, by the KL budget.
#include <ATen/ATen.h>

#include "fault.h"
#include "tinygpt/int8_kv_cache.h"

namespace tinygpt::checks::faults {

void register_int8_faults(FaultFile& r) {
  // The int8 cache's faults (int8_kv_cache.h): each a real way a quantized cache goes wrong, each
  // judged, as the cache is, by the KL budget.
  // A head's keys and values quantized with the next head's scales (an index off by one head).
  class Int8ScaleFromWrongHead final : public Int8KVCache {
   public:
    using Int8KVCache::Int8KVCache;

   protected:
    Quantized quantize_k(int64_t, const at::Tensor& k, const at::Tensor&) const override {
      return quantize_with(k, absmax_scale(k).roll(1, 1));  // scales (B, H, T, 1) rolled along the heads
    }
    Quantized quantize_v(int64_t, const at::Tensor&, const at::Tensor& v) const override {
      return quantize_with(v, absmax_scale(v).roll(1, 1));
    }
    std::unique_ptr<Int8KVCache> make_empty() const override { return std::make_unique<Int8ScaleFromWrongHead>(layers(), window()); }
  };
  r.add(int8_fault<Int8ScaleFromWrongHead>("int8-scale-wrong-head", "int8 cache: each head quantized with the next head's scale"));

  // Keys quantized with the values' scales (the two scale buffers swapped for K): keys larger than
  // their values' absmax clip at +-127.
  class Int8KeysWithValueScale final : public Int8KVCache {
   public:
    using Int8KVCache::Int8KVCache;

   protected:
    Quantized quantize_k(int64_t, const at::Tensor& k, const at::Tensor& v) const override { return quantize_with(k, absmax_scale(v)); }
    std::unique_ptr<Int8KVCache> make_empty() const override { return std::make_unique<Int8KeysWithValueScale>(layers(), window()); }
  };
  r.add(int8_fault<Int8KeysWithValueScale>("int8-k-with-v-scale", "int8 cache: keys quantized with the values' scale"));

  // A scale computed once, for the first token, and never updated: every later token quantized with
  // it (clipped where it is larger, coarse where it is smaller).
  class Int8ScaleFrozen final : public Int8KVCache {
   public:
    using Int8KVCache::Int8KVCache;

   protected:
    static at::Tensor first(const at::Tensor& stored, const at::Tensor& x) {  // (B, H, T, 1)
      const at::Tensor s = stored.defined() ? stored.narrow(2, 0, 1) : absmax_scale(x).narrow(2, 0, 1);
      return s.expand({x.size(0), x.size(1), x.size(2), 1}).contiguous();
    }
    Quantized quantize_k(int64_t l, const at::Tensor& k, const at::Tensor&) const override {
      return quantize_with(k, first(stored_k_scale(l), k));
    }
    Quantized quantize_v(int64_t l, const at::Tensor&, const at::Tensor& v) const override {
      return quantize_with(v, first(stored_v_scale(l), v));
    }
    std::unique_ptr<Int8KVCache> make_empty() const override { return std::make_unique<Int8ScaleFrozen>(layers(), window()); }
  };
  r.add(int8_fault<Int8ScaleFrozen>("int8-scale-frozen", "int8 cache: the first token's scale kept for every later token"));

  // Rounding by truncation (a cast instead of a round): every value pulled toward zero, by up to a
  // whole step.
  class Int8Truncating final : public Int8KVCache {
   public:
    using Int8KVCache::Int8KVCache;

   protected:
    Quantized quantize_k(int64_t, const at::Tensor& k, const at::Tensor&) const override { return quantize_with(k, absmax_scale(k), true); }
    Quantized quantize_v(int64_t, const at::Tensor&, const at::Tensor& v) const override { return quantize_with(v, absmax_scale(v), true); }
    std::unique_ptr<Int8KVCache> make_empty() const override { return std::make_unique<Int8Truncating>(layers(), window()); }
  };
  r.add(int8_fault<Int8Truncating>("int8-truncating", "int8 cache: values rounded by truncation, not to nearest"));
}

}  // namespace tinygpt::checks::faults
