#include "faults.h"

#include <ATen/ATen.h>

#include "tinygpt/rope.h"

namespace tinygpt::checks {

namespace {

// --- positioning and masking faults (AttentionPolicy) ---

// Part 2's rope() built its table from arange(T): a decode step (T=1) lands at position 0.
class RopeOffset final : public AttentionPolicy {
 public:
  void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t) const override {
    AttentionPolicy::position(q, k, v, 0);
  }
};

// scaled_dot_product_attention(is_causal=True) on a 1 x S score matrix: top-left aligned, the
// single decode query sees only the first cached key.
class TopLeftMask final : public AttentionPolicy {
 public:
  at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts) const override {
    const auto i64 = opts.dtype(at::kLong);
    at::Tensor hidden = at::arange(0, tk, i64).unsqueeze(0) > at::arange(0, tq, i64).unsqueeze(1);
    return at::zeros({tq, tk}, opts).masked_fill(hidden, -std::numeric_limits<double>::infinity());
  }
};

// The position counter is read before it counts the token being fed: decode steps lag by one.
class DecodePositionOffByOne final : public AttentionPolicy {
 public:
  void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start) const override {
    AttentionPolicy::position(q, k, v, (q.size(2) == 1 && start > 0) ? start - 1 : start);
  }
};

// The rotation applied to all three of q, k, v (a copy-paste of the q/k line).
class RopeOnValues final : public AttentionPolicy {
 public:
  void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start) const override {
    AttentionPolicy::position(q, k, v, start);
    v = rope(v, start);
  }
};

// is_causal=T > 1 written as is_causal=False: the prefill's queries see later prompt tokens.
class PrefillWithoutMask final : public AttentionPolicy {
 public:
  at::Tensor mask(int64_t, int64_t, const c10::TensorOptions&) const override { return at::Tensor(); }
};

// --- storage faults (KVCache) ---

// A rolling cache with one decision changed; the base keeps the per-layer storage.
class FaultyCache : public KVCache {
 public:
  explicit FaultyCache(const Config& c) : context_(c.context), k_(c.n_layers), v_(c.n_layers) {}
  void reset() override {
    for (auto& t : k_) t = at::Tensor();
    for (auto& t : v_) t = at::Tensor();
  }
  int64_t length() const override { return k_[0].defined() ? k_[0].size(2) : 0; }
  int64_t bytes() const override {
    int64_t n = 0;
    for (size_t i = 0; i < k_.size(); ++i)
      if (k_[i].defined()) n += (k_[i].numel() + v_[i].numel()) * k_[i].element_size();
    return n;
  }

 protected:
  at::Tensor joined(const at::Tensor& old, const at::Tensor& fresh) const {
    return old.defined() ? at::cat({old, fresh}, 2) : fresh;
  }
  at::Tensor last(const at::Tensor& t, int64_t n) const {
    const int64_t keep = std::min(n, t.size(2));
    return t.narrow(2, t.size(2) - keep, keep);
  }
  int64_t context_;
  std::vector<at::Tensor> k_, v_;
};

// `cache["k"], cache["v"] = ...` lost in a refactor after the prefill: decode entries are
// attended to once and never stored.
class StaleCache final : public FaultyCache {
 public:
  using FaultyCache::FaultyCache;
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    at::Tensor K = joined(k_[l], k), V = joined(v_[l], v);
    if (!k_[l].defined()) k_[l] = last(K, context_), v_[l] = last(V, context_);
    return {K, V};
  }
};

// Trim to context BEFORE attending: past the window a decode query sees context keys, not
// context+1 (an off-by-one in where the slice sits).
class TrimBeforeAttend final : public FaultyCache {
 public:
  using FaultyCache::FaultyCache;
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    k_[l] = last(joined(k_[l], k), context_);
    v_[l] = last(joined(v_[l], v), context_);
    return {k_[l], v_[l]};
  }
};

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

// Keys stored where values go and vice versa (a tuple unpacked in the wrong order).
class KVSwapped final : public FaultyCache {
 public:
  using FaultyCache::FaultyCache;
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    at::Tensor K = joined(k_[l], v), V = joined(v_[l], k);
    k_[l] = last(K, context_);
    v_[l] = last(V, context_);
    return {K, V};
  }
};

// reset() forgotten: a server reusing the cache object starts the next request on top of the
// previous request's keys and values.
class NeverReset final : public FaultyCache {
 public:
  using FaultyCache::FaultyCache;
  void reset() override {}
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    at::Tensor K = joined(k_[l], k), V = joined(v_[l], v);
    k_[l] = last(K, context_);
    v_[l] = last(V, context_);
    return {K, V};
  }
};

template <typename Policy>
CacheVariant policy_fault(std::string name, std::string description) {
  return {std::move(name), std::move(description),
          [](const Config& c) { return std::make_unique<RollingKVCache>(c); },
          std::make_shared<Policy>(), true};
}

template <typename Cache>
CacheVariant cache_fault(std::string name, std::string description) {
  return {std::move(name), std::move(description), [](const Config& c) { return std::make_unique<Cache>(c); },
          std::shared_ptr<const AttentionPolicy>(&production_policy(), [](const AttentionPolicy*) {}), true};
}

}  // namespace

void register_faults(CacheRegistry& r) {
  r.add(policy_fault<RopeOffset>("rope-offset", "decode step rotates q and k as if at position 0 (seed gotcha 1)"));
  r.add(policy_fault<TopLeftMask>("topleft-mask", "decode query under a top-left causal mask sees only key 0 (seed gotcha 2)"));
  r.add(policy_fault<DecodePositionOffByOne>("decode-pos-off-by-one", "decode positions lag one behind the tokens fed"));
  r.add(policy_fault<RopeOnValues>("rope-on-v", "RoPE applied to values as well as queries and keys"));
  r.add(policy_fault<PrefillWithoutMask>("prefill-no-mask", "prefill run without the causal mask"));
  r.add(cache_fault<StaleCache>("stale-cache", "decode k, v attended once but never appended to the cache"));
  r.add(cache_fault<TrimBeforeAttend>("trim-before-attend", "cache trimmed before attending: context keys, not context+1"));
  r.add(cache_fault<NeverTrimmed>("never-trimmed", "cache never trimmed: past the window it sees every token"));
  r.add(cache_fault<KVSwapped>("kv-swapped", "keys and values stored in each other's place"));
  r.add(cache_fault<NeverReset>("no-reset", "reset() does nothing: the next generation starts on stale entries"));
}

}  // namespace tinygpt::checks
