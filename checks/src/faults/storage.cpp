// What a KV cache stores (KVCache): each fault one decision of a rolling cache changed.
#include <ATen/ATen.h>

#include "fault.h"

namespace tinygpt::checks::faults {

void register_storage_faults(FaultFile& r) {
  // `cache["k"], cache["v"] = ...` lost in a refactor after the prefill: decode entries are
  // attended to once and never stored.
  class StaleCache final : public FaultyCache {
   public:
    using FaultyCache::FaultyCache;
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
      at::Tensor K = joined(k_[l], k), V = joined(v_[l], v);
      if (!k_[l].defined()) store(l, K, V);
      return {K, V};
    }
  };
  r.add(cache_fault<StaleCache>("stale-cache", "decode k, v attended once but never appended to the cache", in_window));

  // Trim to context BEFORE attending: past the window a decode query sees context keys, not
  // context+1 (an off-by-one in where the slice sits).
  class TrimBeforeAttend final : public FaultyCache {
   public:
    using FaultyCache::FaultyCache;
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
      store(l, joined(k_[l], k), joined(v_[l], v));
      return {k_[l], v_[l]};
    }
  };
  r.add(remedy(cache_fault<TrimBeforeAttend>("trim-before-attend", "cache trimmed before attending: context keys, not context+1", past_window),
                "past the window a decode query sees context keys, one too few: trim after attending (SPEC 4)"), {"transformers:window-256"});

  // The trim line deleted: the cache grows without bound and past the window attends to
  // everything ever fed (and leaks memory).
  class NeverTrimmed final : public FaultyCache {
   public:
    using FaultyCache::FaultyCache;
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
      k_[l] = joined(k_[l], k);
      v_[l] = joined(v_[l], v);
      return {k_[l], v_[l]};
    }
  };
  r.add(remedy(cache_fault<NeverTrimmed>("never-trimmed", "cache never trimmed: past the window it sees every token", past_window),
                "the engine attends to more than context + 1 keys past the window, as if its cache never trims: if it keeps "
                   "every token on purpose (no sliding window), declare \"no-window\" in hello (or run with --no-past-window); if not, "
                   "trim after attending (SPEC 4)"), {"reference:never-trims", "llama.cpp:never-trimmed", "onnxruntime:never-trimmed"});

  // Keys stored where values go and vice versa (a tuple unpacked in the wrong order).
  class KVSwapped final : public FaultyCache {
   public:
    using FaultyCache::FaultyCache;
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
      return append(l, v, k);
    }
  };
  r.add(cache_fault<KVSwapped>("kv-swapped", "keys and values stored in each other's place", in_window));

  // reset() forgotten: a server reusing the cache object starts the next request on top of the
  // previous request's keys and values.
  class NeverReset final : public FaultyCache {
   public:
    using FaultyCache::FaultyCache;
    void reset() override {}
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override { return append(l, k, v); }
  };
  r.add(remedy(cache_fault<NeverReset>("no-reset", "the cache's reset() does nothing: the next sequence starts on stale entries",
                                {check::kReset, check::kTeacherForced}),
                "the next sequence starts on the previous one's entries: clear the cache on reset"));
}

}  // namespace tinygpt::checks::faults
