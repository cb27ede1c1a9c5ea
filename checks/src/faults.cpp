#include "faults.h"

#include <ATen/ATen.h>

#include "tinygpt/rope.h"
#include "tinygpt/serving.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/fused_step.h"
#include "tinygpt/int8_kv_cache.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt::checks {

namespace {

// --- positioning and masking faults (AttentionPolicy) ---

// Part 2's rope() built its table from arange(T): a decode step (T=1) lands at position 0.
class RopeOffset final : public AttentionPolicy {
 public:
  void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t, const Rotary& r) const override {
    AttentionPolicy::position(q, k, v, 0, r);
  }
};

// scaled_dot_product_attention(is_causal=True) on a 1 x S score matrix: top-left aligned, the
// single decode query sees only the first cached key.
class TopLeftMask final : public AttentionPolicy {
 public:
  at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t) const override {
    const auto i64 = opts.dtype(at::kLong);
    at::Tensor hidden = at::arange(0, tk, i64).unsqueeze(0) > at::arange(0, tq, i64).unsqueeze(1);
    return at::zeros({tq, tk}, opts).masked_fill(hidden, -std::numeric_limits<double>::infinity());
  }
};

// The attention layer rotates a decode token one position early (its own off-by-one; the loop's
// counter is right).
class DecodePositionOffByOne final : public AttentionPolicy {
 public:
  void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start, const Rotary& r) const override {
    AttentionPolicy::position(q, k, v, (q.size(2) == 1 && start > 0) ? start - 1 : start, r);
  }
};

// The rotation applied to all three of q, k, v (a copy-paste of the q/k line).
class RopeOnValues final : public AttentionPolicy {
 public:
  void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start, const Rotary& r) const override {
    AttentionPolicy::position(q, k, v, start, r);
    v = r.rotate_one(v, start);
  }
};

// is_causal=T > 1 written as is_causal=False: the prefill's queries see later prompt tokens.
class PrefillWithoutMask final : public AttentionPolicy {
 public:
  at::Tensor mask(int64_t, int64_t, const c10::TensorOptions&, int64_t) const override { return at::Tensor(); }
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

// --- batch faults (KVCache): invisible at batch 1 ---

// A slot-index bug: every update stores row b's keys and values as row (b+1) mod B's, so from the
// second step on each row attends to its neighbour's history.
class RowsMixed final : public FaultyCache {
 public:
  using FaultyCache::FaultyCache;
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    at::Tensor K = joined(k_[l], k), V = joined(v_[l], v);
    k_[l] = last(K, context_).roll(1, 0);
    v_[l] = last(V, context_).roll(1, 0);
    return {K, V};
  }
};

// Admission into the wrong slot: the prompt's entries (the first update after a reset) are
// stored one row off, so row b decodes on top of row b-1's prompt; decode steps store correctly.
class PrefillRowsShifted final : public FaultyCache {
 public:
  using FaultyCache::FaultyCache;
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    const bool prefill = !k_[l].defined();
    at::Tensor K = joined(k_[l], k), V = joined(v_[l], v);
    k_[l] = prefill ? last(K, context_).roll(1, 0) : last(K, context_);
    v_[l] = prefill ? last(V, context_).roll(1, 0) : last(V, context_);
    return {K, V};
  }
};

// --- loop faults (DecodeSchedule): the bookkeeping of generate_cached, not the cache ---

// `pos % context`: the position counter wraps when the window is full.
class WrappedPositions final : public DecodeSchedule {
 public:
  int64_t position(int64_t fed, int64_t context) const override { return fed % context; }
};

// `min(pos, context - 1)`: the position counter stops growing at the window's last slot.
class ClampedPositions final : public DecodeSchedule {
 public:
  int64_t position(int64_t fed, int64_t context) const override { return std::min(fed, context - 1); }
};

// `min(pos, context)`: the positions stop growing at the context itself, one past the window's last
// slot (transformers.js's position ids, derived from an attention mask its trimmed cache keeps at
// `context` entries). Right up to position context; every token after sits at `context`.
class PositionsStopAtContext final : public DecodeSchedule {
 public:
  int64_t position(int64_t fed, int64_t context) const override { return std::min(fed, context); }
};

// The position read before it counts the previous token: each decode token is fed at the
// previous token's position (the loop's off-by-one; the attention policy is correct).
class LoopPositionOffByOne final : public DecodeSchedule {
 public:
  int64_t position(int64_t fed, int64_t) const override { return fed - 1; }
};

// `prompt[:, :context]` for `prompt[:, -context:]`: a prompt longer than the window is prefilled
// from its start instead of its end.
class PrefillFromTheStart final : public DecodeSchedule {
 public:
  int64_t prefill_start(int64_t, int64_t) const override { return 0; }
};

// The loop never calls reset(): a server's second request decodes on top of the first one's
// keys and values.
class LoopWithoutReset final : public DecodeSchedule {
 public:
  void begin(KVCache&) const override {}
};

// The chooser is handed only the generated tokens, not the prompt: the repetition penalty forgets
// the prompt. Logits stay right; only sampled runs with a penalty show it.
class HistoryWithoutPrompt final : public DecodeSchedule {
 public:
  at::Tensor history(const at::Tensor& seq, int64_t prompt_len) const override {
    return seq.narrow(1, prompt_len, seq.size(1) - prompt_len);
  }
};

// --- serving faults: what a server does to a cache (serving.h) ---

// A cache of in-place buffers behind a handle; the serving faults below change one operation.
class Wrapped : public KVCache {
 public:
  explicit Wrapped(std::shared_ptr<KVCache> inner) : inner_(std::move(inner)) {}
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override { return inner_->update(l, k, v); }
  void reset() override { inner_->reset(); }
  int64_t length() const override { return inner_->length(); }
  int64_t bytes() const override { return inner_->bytes(); }
  int64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  std::string row_ops_unsupported() const override { return ""; }
  void truncate(int64_t n) override { inner_->truncate(n); }

 protected:
  std::shared_ptr<KVCache> inner_;
};

// A fork that copies the handle, not the entries: parent and child write into one storage.
class ForkSharesStorage final : public Wrapped {
 public:
  explicit ForkSharesStorage(const Config& c) : Wrapped(std::make_shared<StaticKVCache>(c)) {}
  explicit ForkSharesStorage(std::shared_ptr<KVCache> shared) : Wrapped(std::move(shared)) {}
  std::unique_ptr<KVCache> clone() const override { return std::make_unique<ForkSharesStorage>(inner_); }
};

// A rollback one entry short: one rejected draft token stays in the cache.
class TruncateOffByOne final : public Wrapped {
 public:
  explicit TruncateOffByOne(const Config& c) : Wrapped(std::make_shared<StaticKVCache>(c)) {}
  explicit TruncateOffByOne(std::unique_ptr<KVCache> inner) : Wrapped(std::move(inner)) {}
  void truncate(int64_t n) override { inner_->truncate(n > 0 ? n - 1 : 0); }
  std::unique_ptr<KVCache> clone() const override { return std::make_unique<TruncateOffByOne>(inner_->clone()); }
};

// A rolling cache that keeps only the window: a rollback past it cannot bring back the entries the
// drafts pushed out, so the window is short by the rolled-back count. SPEC 4's window after a
// rollback is the last `context` tokens of the remaining sequence, older entries included.
class TruncateForgetsTheWindow final : public FaultyCache {
 public:
  using FaultyCache::FaultyCache;
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    at::Tensor K = joined(k_[l], k), V = joined(v_[l], v);
    k_[l] = last(K, context_);
    v_[l] = last(V, context_);
    return {K, V};
  }
  std::string row_ops_unsupported() const override { return ""; }
  void truncate(int64_t n) override {
    for (size_t l = 0; l < k_.size(); ++l) {
      if (!k_[l].defined()) continue;
      const int64_t keep = k_[l].size(2) - n;
      k_[l] = keep > 0 ? k_[l].narrow(2, 0, keep) : at::Tensor();
      v_[l] = keep > 0 ? v_[l].narrow(2, 0, keep) : at::Tensor();
    }
  }
  std::unique_ptr<KVCache> clone() const override {
    auto c = std::make_unique<TruncateForgetsTheWindow>(*this);
    for (size_t l = 0; l < k_.size(); ++l)
      if (k_[l].defined()) c->k_[l] = k_[l].clone(), c->v_[l] = v_[l].clone();
    return c;
  }
};

// A cache of the static layout - live entries at [begin, begin + len) of a buffer, the window and
// kRollbackEntries more, moved back to slot 0 when the buffer's end is reached - whose fork copies
// the buffer but not where the live entries begin. Harmless while they start at slot 0; a fork of a
// row more than kRollbackEntries past the window sees other entries than its parent's.
class ForkLosesTheOffset final : public KVCache {
 public:
  explicit ForkLosesTheOffset(const Config& c) : context_(c.context), layers_(static_cast<size_t>(c.n_layers)) {}
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    Layer& L = layers_.at(static_cast<size_t>(l));
    // Room for two windows and their rollback entries: the live entries drift far from slot 0.
    const int64_t T = k.size(2), cap = 2 * (context_ + kRollbackEntries) + T;
    if (!L.k.defined() || L.k.size(0) != k.size(0) || L.k.size(1) != k.size(1) || L.k.size(3) != k.size(3)) {
      L = Layer{};
      L.k = at::zeros({k.size(0), k.size(1), cap, k.size(3)}, k.options());  // (B, H, cap, hd)
      L.v = at::zeros_like(L.k);
    }
    if (L.begin + L.len + T > cap) {  // move the live entries to the front
      L.k.narrow(2, 0, L.len).copy_(L.k.narrow(2, L.begin, L.len).clone());
      L.v.narrow(2, 0, L.len).copy_(L.v.narrow(2, L.begin, L.len).clone());
      L.begin = 0;
    }
    L.k.narrow(2, L.begin + L.len, T).copy_(k);
    L.v.narrow(2, L.begin + L.len, T).copy_(v);
    const int64_t seen = std::min(L.len, context_) + T;
    L.len += T;
    std::pair<at::Tensor, at::Tensor> out = {L.k.narrow(2, L.begin + L.len - seen, seen), L.v.narrow(2, L.begin + L.len - seen, seen)};
    const int64_t over = L.len - (context_ + kRollbackEntries);
    if (over > 0) L.begin += over, L.len -= over;
    return out;
  }
  void reset() override { layers_.assign(layers_.size(), Layer{}); }
  int64_t length() const override { return std::min(layers_[0].len, context_); }
  int64_t bytes() const override {
    int64_t n = 0;
    for (const Layer& L : layers_)
      if (L.k.defined()) n += 2 * L.len * L.k.size(0) * L.k.size(1) * L.k.size(3) * L.k.element_size();
    return n;
  }
  std::string row_ops_unsupported() const override { return ""; }
  std::unique_ptr<KVCache> clone() const override {
    auto c = std::make_unique<ForkLosesTheOffset>(*this);
    for (Layer& L : c->layers_) {
      if (L.k.defined()) L.k = L.k.clone(), L.v = L.v.clone();
      L.begin = 0;  // the bug: the copy reads its entries from the buffer's first slot
    }
    return c;
  }
  void truncate(int64_t n) override {
    if (n < 0 || n > layers_[0].len) throw std::invalid_argument("cannot drop " + std::to_string(n) + " entries");
    for (Layer& L : layers_) L.len -= n;
  }

 private:
  struct Layer {
    at::Tensor k, v;
    int64_t begin = 0, len = 0;
  };
  int64_t context_;
  std::vector<Layer> layers_;
};

// A row's state saved in part: without its oldest 16 entries (a fragmented cache saved from its
// second block on), so the restored row attends to a shorter window than it had.
class SavesInPart final : public Wrapped {
 public:
  explicit SavesInPart(const Config& c) : Wrapped(std::make_shared<StaticKVCache>(c)) {}
  explicit SavesInPart(std::unique_ptr<KVCache> inner) : Wrapped(std::move(inner)) {}
  std::unique_ptr<KVCache> clone() const override { return std::make_unique<SavesInPart>(inner_->clone()); }
  std::string save_unsupported() const override { return ""; }
  std::pair<at::Tensor, at::Tensor> stored(int64_t layer) const override {
    auto kv = inner_->stored(layer);
    const int64_t S = kv.first.defined() ? kv.first.size(2) : 0, lost = std::min<int64_t>(16, S - 1);
    if (lost < 1) return kv;
    return {kv.first.narrow(2, lost, S - lost), kv.second.narrow(2, lost, S - lost)};
  }
};

// A row's state saved with its window only: the entries a rollback past the window brings back (the
// cache's history, kRollbackEntries) left out, as a cache saved by its visible window would be. The
// restored row is right until it rolls back across the window's old edge.
class SavesOnlyTheWindow final : public Wrapped {
 public:
  explicit SavesOnlyTheWindow(const Config& c) : Wrapped(std::make_shared<StaticKVCache>(c)), context_(c.context) {}
  SavesOnlyTheWindow(std::unique_ptr<KVCache> inner, int64_t context) : Wrapped(std::move(inner)), context_(context) {}
  std::unique_ptr<KVCache> clone() const override { return std::make_unique<SavesOnlyTheWindow>(inner_->clone(), context_); }
  std::string save_unsupported() const override { return ""; }
  std::pair<at::Tensor, at::Tensor> stored(int64_t layer) const override {
    auto kv = inner_->stored(layer);
    const int64_t S = kv.first.defined() ? kv.first.size(2) : 0;
    if (S <= context_) return kv;
    return {kv.first.narrow(2, S - context_, context_), kv.second.narrow(2, S - context_, context_)};
  }

 private:
  int64_t context_;
};

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
// Keys quantized with the values' scales (the two scale buffers swapped for K): keys larger than
// their values' absmax clip at +-127.
class Int8KeysWithValueScale final : public Int8KVCache {
 public:
  using Int8KVCache::Int8KVCache;

 protected:
  Quantized quantize_k(int64_t, const at::Tensor& k, const at::Tensor& v) const override { return quantize_with(k, absmax_scale(v)); }
  std::unique_ptr<Int8KVCache> make_empty() const override { return std::make_unique<Int8KeysWithValueScale>(layers(), window()); }
};
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

// Left padding without per-row positions: a ragged prefill's tokens numbered by their column in the
// padded batch, so a shorter row's prompt sits `pad` positions late, while its decode steps count the
// row's own tokens: the first step lands `pad` positions too close to its prompt. (A shift of a whole
// row would be invisible to RoPE, which sees distances only.)
class PaddedPositions final : public ServingSchedule {
 public:
  int64_t prefill_position(int64_t col, int64_t) const override { return col; }
};

// One position counter for the whole batch: a row that joined later (or a shorter row) is stepped at
// the longest row's position, not its own.
class BatchPositionForEveryRow final : public ServingSchedule {
 public:
  int64_t step_position(int64_t, int64_t batch_next) const override { return batch_next; }
};

// A released row's slot handed to a new row as it was: the new row starts on the old one's entries.
class SlotReusedWithoutReset final : public ServingSchedule {
 public:
  void reuse(KVCache&) const override {}
};

// A chunk appended to a row (extend) numbered from 0 instead of from the row's next position.
class ChunkPositionsRestart final : public ServingSchedule {
 public:
  int64_t extend_position(int64_t, int64_t i) const override { return i; }
};

// A step's position counters kept by request index instead of by row: request i reads and advances
// the counter of slot i. The same while the rows of a step are slots 0, 1, 2... in order.
class PositionByRequest final : public ServingSchedule {
 public:
  int64_t step_counter(const std::vector<int64_t>&, size_t request) const override { return static_cast<int64_t>(request); }
};

// A prompt whose every token is cached keeps all of them and feeds its last token again after them:
// the reused prefix is one entry too long (the "last prompt token is computed again" edge).
class ReusedPrefixTooLong final : public ServingSchedule {
 public:
  int64_t reused_prefix(int64_t shared, int64_t) const override { return shared; }
};

// A context shift that renumbers the kept entries but leaves their keys as they were rotated: each
// later key sits `discard` positions further from every new query than its entry says.
class ShiftKeysNotRotated final : public ServingSchedule {
 public:
  int64_t shift_rotation(int64_t) const override { return 0; }
};

// A context shift that moves the entries down but not the row's own position counter: the next
// tokens are fed at the positions they would have had without the shift.
class ShiftPositionKept final : public ServingSchedule {
 public:
  int64_t shift_next(int64_t next, int64_t) const override { return next; }
};

// A context shift whose re-rotation is one position short: every kept later key sits one position
// away from where its entry says (an off-by-one in the delta seq_add is given).
class ShiftOffByOne final : public ServingSchedule {
 public:
  int64_t shift_rotation(int64_t discard) const override { return discard - 1; }
};

// A prompt's prefix served from a released row that went past the window and its history: its first
// entries are gone (a ring buffer's, overwritten), what is kept for them is later positions' (the
// guard on how far the row went forgotten).
class ReusedPastTheWindow final : public ServingSchedule {
 public:
  bool reusable(bool live, int64_t, int64_t) const override { return !live; }
};

// A context shift's kept later tokens still offered to a later prompt's match: their entries were
// computed while the dropped tokens were visible, so a prompt of the shifted row's tokens is served
// entries that are not its cold run's (llama-server's slots match prompts against shifted tokens).
class ShiftedEntriesReused final : public ServingSchedule {
 public:
  int64_t shifted_token(int64_t id) const override { return id; }
};

// A live row taken as the source of a new prompt's prefix: the new row takes its slot, and the row
// still running finds its cache truncated under it.
class LiveRowReused final : public ServingSchedule {
 public:
  bool reusable(bool, int64_t peak, int64_t context) const override { return peak <= context; }
};

}  // namespace

CacheVariant fault(std::string name, std::string description, std::vector<std::string> expected) {
  CacheVariant v;
  v.name = std::move(name);
  v.description = std::move(description);
  v.make_cache = [](const Config& c) { return std::make_unique<StaticKVCache>(c); };
  v.kernels = Kernels::Decode;
  v.make_step = [](KVCache& cache) { return std::make_unique<FusedCpuStep>(static_cast<StaticKVCache&>(cache)); };
  v.is_fault = true;
  v.expected = std::move(expected);
  return v;
}

namespace {

// A policy fault runs the model's own step with the same kernels: the fused step computes the
// production positions and mask inside its kernels, so the changed policy must be the one the step reads.
template <typename Policy>
CacheVariant policy_fault(std::string name, std::string description, std::vector<std::string> expected) {
  CacheVariant v = fault(std::move(name), std::move(description), std::move(expected));
  v.make_step = nullptr;
  v.policy = std::make_shared<Policy>();
  return v;
}

// A cache fault brings its own storage, so it runs the model's own step: the fused step writes into
// a StaticKVCache's buffers directly and would bypass the fault.
template <typename Cache>
CacheVariant cache_fault(std::string name, std::string description, std::vector<std::string> expected) {
  CacheVariant v = fault(std::move(name), std::move(description), std::move(expected));
  v.make_step = nullptr;
  v.make_cache = [](const Config& c) { return std::make_unique<Cache>(c); };
  return v;
}

// Serving faults run the rows that drive a serving operation (the default rows never drive rows
// apart), but the long ones (Tag::Long: far past the window, many operations) only where the fault is
// theirs: together they would triple the fault matrix's time.
std::vector<std::string> serving_rows_for(const std::string& expected) {
  std::vector<std::string> out;
  for (const auto& n : row_operation_checks())
    if (n == expected || !find_check(n).is(Tag::Long)) out.push_back(n);
  return out;
}

template <typename Cache>
CacheVariant serving_cache_fault(std::string name, std::string description, std::string expected) {
  CacheVariant v = cache_fault<Cache>(std::move(name), std::move(description), {expected});
  v.checks = serving_rows_for(expected);
  return v;
}

template <typename Schedule>
CacheVariant serving_loop_fault(std::string name, std::string description, std::string expected) {
  CacheVariant v = fault(std::move(name), std::move(description), {expected});
  v.serving = std::make_shared<Schedule>();
  v.checks = serving_rows_for(expected);
  return v;
}

template <typename Schedule>
CacheVariant loop_fault(std::string name, std::string description, std::vector<std::string> expected) {
  CacheVariant v = fault(std::move(name), std::move(description), std::move(expected));
  v.schedule = std::make_shared<Schedule>();
  return v;
}

template <typename Cache>
CacheVariant int8_fault(std::string name, std::string description) {
  CacheVariant v = cache_fault<Cache>(std::move(name), std::move(description), {check::kWindowReference, check::kTeacherForced});
  v.kv_budget = kInt8KvBudget;
  return v;
}

// The seed's two planted bugs, with the drift it reports for each on its Holmes model.
CacheVariant seed_fault(CacheVariant v, int64_t seed_drift) {
  v.seed_drift = seed_drift;
  return v;
}

}  // namespace

void register_faults(CacheRegistry& r) {
  // Which checks must catch each fault on any model: the logit-level ones that see its effect.
  // Token checks are left out: on untrained weights greedy decoding repeats one token and misses most.
  const std::vector<std::string> in_window = {check::kLogits, check::kWindowReference, check::kTeacherForced};
  const std::vector<std::string> past_window = {check::kWindowReference, check::kTeacherForced};
  r.add(seed_fault(policy_fault<RopeOffset>("rope-offset", "decode step rotates q and k as if at position 0 (seed gotcha 1)", in_window), 7));
  r.add(seed_fault(policy_fault<TopLeftMask>("topleft-mask", "decode query under a top-left causal mask sees only key 0 (seed gotcha 2)", in_window), 3));
  r.add(policy_fault<DecodePositionOffByOne>("decode-pos-off-by-one", "attention rotates decode tokens one position early", in_window));
  r.add(policy_fault<RopeOnValues>("rope-on-v", "RoPE applied to values as well as queries and keys", in_window));
  r.add(policy_fault<PrefillWithoutMask>("prefill-no-mask", "prefill run without the causal mask", in_window));
  r.add(cache_fault<StaleCache>("stale-cache", "decode k, v attended once but never appended to the cache", in_window));
  r.add(cache_fault<TrimBeforeAttend>("trim-before-attend", "cache trimmed before attending: context keys, not context+1", past_window));
  r.add(cache_fault<NeverTrimmed>("never-trimmed", "cache never trimmed: past the window it sees every token", past_window));
  r.add(cache_fault<KVSwapped>("kv-swapped", "keys and values stored in each other's place", in_window));
  r.add(cache_fault<NeverReset>("no-reset", "the cache's reset() does nothing: the next sequence starts on stale entries",
                                {check::kReset, check::kTeacherForced}));
  r.add(loop_fault<WrappedPositions>("loop-wrapped-positions", "the loop wraps positions at the window (pos % context)",
                                     {check::kWindowReference, check::kLongPrompt}));
  r.add(loop_fault<ClampedPositions>("loop-clamped-positions", "the loop's positions stop growing at the window's last slot",
                                     {check::kWindowReference, check::kLongPrompt}));
  r.add(loop_fault<PositionsStopAtContext>("loop-positions-stop-at-context",
                                           "the loop's positions stop growing at the context (transformers.js's own position ids)",
                                           {check::kWindowReference}));
  r.add(loop_fault<LoopPositionOffByOne>("loop-pos-off-by-one", "the loop feeds each decode token at the previous token's position",
                                         {check::kLogits, check::kWindowReference, check::kLongPrompt}));
  r.add(loop_fault<PrefillFromTheStart>("loop-prefill-offset", "a prompt longer than the window is prefilled from its start, not its end",
                                        {check::kLongPrompt}));
  r.add(loop_fault<LoopWithoutReset>("loop-no-reset", "the loop forgets to reset the cache between calls", {check::kReset}));
  r.add(loop_fault<HistoryWithoutPrompt>("loop-history-no-prompt", "the sampler's history leaves out the prompt (penalty forgets it)",
                                         {check::kSampled}));
  r.add(cache_fault<RowsMixed>("rows-mixed", "row b's keys and values stored as row b+1's", {check::kBatch}));
  r.add(cache_fault<PrefillRowsShifted>("prefill-rows-shifted", "the prompt's entries stored one row off (admission into the wrong slot)",
                                        {check::kBatch}));
  // Serving faults: each runs the serving checks (the default ones never drive rows apart).
  r.add(serving_loop_fault<PaddedPositions>("ragged-padded-positions",
                                            "a ragged prefill's positions counted from the padded length (left padding)", check::kRagged));
  r.add(serving_loop_fault<BatchPositionForEveryRow>("joined-row-at-batch-position",
                                                     "a row that joined a running batch stepped at the batch's position", check::kJoinLeave));
  r.add(serving_loop_fault<SlotReusedWithoutReset>("released-slot-not-reset",
                                                   "a left row's cache slot handed to a new row without a reset", check::kJoinLeave));
  r.add(serving_cache_fault<ForkSharesStorage>("fork-shares-storage", "a forked row's cache shares its parent's storage", check::kFork));
  r.add(serving_cache_fault<TruncateOffByOne>("truncate-off-by-one", "a rollback drops one entry too few", check::kRollback));
  r.add(serving_cache_fault<TruncateForgetsTheWindow>(
      "truncate-forgets-the-window", "a rollback past the window does not bring back the entries the drafts pushed out", check::kRollback));
  r.add(serving_cache_fault<ForkLosesTheOffset>("fork-loses-the-offset", "a fork forgets where its parent's live entries begin in the buffer",
                                                check::kFork));
  r.add(serving_loop_fault<ChunkPositionsRestart>("chunk-positions-restart", "a chunk appended to a row numbered from 0, not from the row's position",
                                                  check::kChunkedPrefill));
  r.add(serving_loop_fault<ReusedPrefixTooLong>("reused-prefix-too-long",
                                                "a fully cached prompt keeps every entry and feeds its last token again after them",
                                                check::kPrefixReuse));
  r.add(serving_cache_fault<SavesInPart>("state-saved-in-part", "a row's state saved without its oldest 16 entries",
                                         check::kSaveRestore));
  r.add(serving_loop_fault<PositionByRequest>("position-by-request", "a step's position counters kept by request index, not by row",
                                              check::kChurn));
  r.add(serving_loop_fault<ShiftKeysNotRotated>("shift-keys-not-rotated",
                                                "a context shift renumbers the kept entries but leaves their keys as rotated",
                                                check::kContextShift));
  r.add(serving_loop_fault<ShiftOffByOne>("shift-off-by-one", "a context shift rotates the kept keys back one position too few",
                                          check::kContextShift));
  r.add(serving_loop_fault<ShiftPositionKept>("shift-position-kept", "a context shift leaves the row's next position where it was",
                                              check::kContextShift));
  r.add(serving_loop_fault<LiveRowReused>("live-row-reused", "a live row taken as a new prompt's prefix source, truncated under it",
                                          check::kPrefixReuse));
  r.add(serving_loop_fault<ShiftedEntriesReused>("shifted-entries-reused",
                                                 "a context shift's kept later entries served to a later prompt as its prefix",
                                                 check::kReuseAfterShift));
  r.add(serving_loop_fault<ReusedPastTheWindow>("reused-past-the-window",
                                                "a prefix served from a released row whose first entries the window pushed out",
                                                check::kReusePastWindow));
  r.add(serving_cache_fault<SavesOnlyTheWindow>("state-saved-without-history",
                                                "a row's state saved with its window only: a rollback after the restore has nothing to bring back",
                                                check::kRollbackAfterRestore));
  // The int8 cache's faults, judged by its KL budget (in budgeted(), not all()).
  r.add(int8_fault<Int8ScaleFromWrongHead>("int8-scale-wrong-head", "int8 cache: each head quantized with the next head's scale"));
  r.add(int8_fault<Int8KeysWithValueScale>("int8-k-with-v-scale", "int8 cache: keys quantized with the values' scale"));
  r.add(int8_fault<Int8ScaleFrozen>("int8-scale-frozen", "int8 cache: the first token's scale kept for every later token"));
  r.add(int8_fault<Int8Truncating>("int8-truncating", "int8 cache: values rounded by truncation, not to nearest"));
}

}  // namespace tinygpt::checks
