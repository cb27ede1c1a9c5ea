// What a server does to a cache (serving.h): rows that join and leave, fork, roll back, save and
// restore, shift and reuse a prefix - each fault one operation of a cache (Wrapped, FaultyCache) or of
// the serving loop's bookkeeping (ServingSchedule) changed. Each runs the rows that drive a serving
// operation (serving_rows_for).
#include <ATen/ATen.h>

#include "fault.h"
#include "tinygpt/serving.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt::checks::faults {

void register_serving_faults(FaultFile& r) {
  // Left padding without per-row positions: a ragged prefill's tokens numbered by their column in the
  // padded batch, so a shorter row's prompt sits `pad` positions late, while its decode steps count the
  // row's own tokens: the first step lands `pad` positions too close to its prompt. (A shift of a whole
  // row would be invisible to RoPE, which sees distances only.)
  class PaddedPositions final : public ServingSchedule {
   public:
    int64_t prefill_position(int64_t col, int64_t) const override { return col; }
  };
  r.add(serving_loop_fault<PaddedPositions>("ragged-padded-positions",
                                            "a ragged prefill's positions counted from the padded length (left padding)", check::kRagged));

  // One position counter for the whole batch: a row that joined later (or a shorter row) is stepped at
  // the longest row's position, not its own.
  class BatchPositionForEveryRow final : public ServingSchedule {
   public:
    int64_t step_position(int64_t, int64_t batch_next) const override { return batch_next; }
  };
  r.add(serving_loop_fault<BatchPositionForEveryRow>("joined-row-at-batch-position",
                                                     "a row that joined a running batch stepped at the batch's position", check::kJoinLeave));

  // A released row's slot handed to a new row as it was: the new row starts on the old one's entries.
  class SlotReusedWithoutReset final : public ServingSchedule {
   public:
    void reuse(KVCache&) const override {}
  };
  r.add(serving_loop_fault<SlotReusedWithoutReset>("released-slot-not-reset",
                                                   "a left row's cache slot handed to a new row without a reset", check::kJoinLeave),
        {"reference:released-slot-not-reset", "reference:released-slot-kept-on-reuse"});

  // A fork that copies the handle, not the entries: parent and child write into one storage.
  class ForkSharesStorage final : public Wrapped {
   public:
    explicit ForkSharesStorage(const Config& c) : Wrapped(std::make_shared<StaticKVCache>(c)) {}
    explicit ForkSharesStorage(std::shared_ptr<KVCache> shared) : Wrapped(std::move(shared)) {}
    std::unique_ptr<KVCache> clone() const override { return std::make_unique<ForkSharesStorage>(inner_); }
  };
  r.add(serving_cache_fault<ForkSharesStorage>("fork-shares-storage", "a forked row's cache shares its parent's storage", check::kFork), {"reference:fork-shares-storage"});

  // A rollback one entry short: one rejected draft token stays in the cache.
  class TruncateOffByOne final : public Wrapped {
   public:
    explicit TruncateOffByOne(const Config& c) : Wrapped(std::make_shared<StaticKVCache>(c)) {}
    explicit TruncateOffByOne(std::unique_ptr<KVCache> inner) : Wrapped(std::move(inner)) {}
    void truncate(int64_t n) override { inner_->truncate(n > 0 ? n - 1 : 0); }
    std::unique_ptr<KVCache> clone() const override { return std::make_unique<TruncateOffByOne>(inner_->clone()); }
  };
  r.add(serving_cache_fault<TruncateOffByOne>("truncate-off-by-one", "a rollback drops one entry too few", check::kRollback), {"reference:rollback-keeps-one"});

  // A rolling cache that keeps only the window: a rollback past it cannot bring back the entries the
  // drafts pushed out, so the window is short by the rolled-back count. SPEC 4's window after a
  // rollback is the last `context` tokens of the remaining sequence, older entries included.
  class TruncateForgetsTheWindow final : public FaultyCache {
   public:
    using FaultyCache::FaultyCache;
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override { return append(l, k, v); }
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
  r.add(serving_cache_fault<TruncateForgetsTheWindow>(
      "truncate-forgets-the-window", "a rollback past the window does not bring back the entries the drafts pushed out", check::kRollback), {"llama.cpp:rollback-forgets-the-window"});

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
  r.add(serving_cache_fault<ForkLosesTheOffset>("fork-loses-the-offset", "a fork forgets where its parent's live entries begin in the buffer",
                                                check::kFork));

  // A chunk appended to a row (extend) numbered from 0 instead of from the row's next position.
  class ChunkPositionsRestart final : public ServingSchedule {
   public:
    int64_t extend_position(int64_t, int64_t i) const override { return i; }
  };
  r.add(serving_loop_fault<ChunkPositionsRestart>("chunk-positions-restart", "a chunk appended to a row numbered from 0, not from the row's position",
                                                  check::kChunkedPrefill), {"reference:chunk-positions-restart"});

  // A prompt whose every token is cached keeps all of them and feeds its last token again after them:
  // the reused prefix is one entry too long (the "last prompt token is computed again" edge).
  class ReusedPrefixTooLong final : public ServingSchedule {
   public:
    int64_t reused_prefix(int64_t shared, int64_t) const override { return shared; }
  };
  r.add(serving_loop_fault<ReusedPrefixTooLong>("reused-prefix-too-long",
                                                "a fully cached prompt keeps every entry and feeds its last token again after them",
                                                check::kPrefixReuse), {"reference:reused-prefix-too-long", "reference:reused-one-past-the-prefix", "llama.cpp:reused-prefix-too-long"});

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
  r.add(serving_cache_fault<SavesInPart>("state-saved-in-part", "a row's state saved without its oldest 16 entries",
                                         check::kSaveRestore), {"llama.cpp:state-saved-in-part"});

  // A step's position counters kept by request index instead of by row: request i reads and advances
  // the counter of slot i. The same while the rows of a step are slots 0, 1, 2... in order.
  class PositionByRequest final : public ServingSchedule {
   public:
    int64_t step_counter(const std::vector<int64_t>&, size_t request) const override { return static_cast<int64_t>(request); }
  };
  r.add(serving_loop_fault<PositionByRequest>("position-by-request", "a step's position counters kept by request index, not by row",
                                              check::kChurn), {"reference:position-by-request"});

  // A context shift that renumbers the kept entries but leaves their keys as they were rotated: each
  // later key sits `discard` positions further from every new query than its entry says.
  class ShiftKeysNotRotated final : public ServingSchedule {
   public:
    int64_t shift_rotation(int64_t) const override { return 0; }
  };
  r.add(serving_loop_fault<ShiftKeysNotRotated>("shift-keys-not-rotated",
                                                "a context shift renumbers the kept entries but leaves their keys as rotated",
                                                check::kContextShift), {"reference:shift-keys-not-rotated"});

  // A context shift whose re-rotation is one position short: every kept later key sits one position
  // away from where its entry says (an off-by-one in the delta seq_add is given).
  class ShiftOffByOne final : public ServingSchedule {
   public:
    int64_t shift_rotation(int64_t discard) const override { return discard - 1; }
  };
  r.add(serving_loop_fault<ShiftOffByOne>("shift-off-by-one", "a context shift rotates the kept keys back one position too few",
                                          check::kContextShift), {"reference:shift-off-by-one"});

  // A context shift that moves the entries down but not the row's own position counter: the next
  // tokens are fed at the positions they would have had without the shift.
  class ShiftPositionKept final : public ServingSchedule {
   public:
    int64_t shift_next(int64_t next, int64_t) const override { return next; }
  };
  r.add(serving_loop_fault<ShiftPositionKept>("shift-position-kept", "a context shift leaves the row's next position where it was",
                                              check::kContextShift));

  // A live row taken as the source of a new prompt's prefix: the new row takes its slot, and the row
  // still running finds its cache truncated under it.
  class LiveRowReused final : public ServingSchedule {
   public:
    bool reusable(bool, int64_t peak, int64_t context) const override { return peak <= context; }
  };
  r.add(serving_loop_fault<LiveRowReused>("live-row-reused", "a live row taken as a new prompt's prefix source, truncated under it",
                                          check::kPrefixReuse), {"reference:live-row-reused"});

  // A context shift's kept later tokens still offered to a later prompt's match: their entries were
  // computed while the dropped tokens were visible, so a prompt of the shifted row's tokens is served
  // entries that are not its cold run's (llama-server's slots match prompts against shifted tokens).
  class ShiftedEntriesReused final : public ServingSchedule {
   public:
    int64_t shifted_token(int64_t id) const override { return id; }
  };
  r.add(serving_loop_fault<ShiftedEntriesReused>("shifted-entries-reused",
                                                 "a context shift's kept later entries served to a later prompt as its prefix",
                                                 check::kReuseAfterShift), {"reference:shifted-entries-reused"});

  // A prompt's prefix served from a released row that went past the window and its history: its first
  // entries are gone (a ring buffer's, overwritten), what is kept for them is later positions' (the
  // guard on how far the row went forgotten).
  class ReusedPastTheWindow final : public ServingSchedule {
   public:
    bool reusable(bool live, int64_t, int64_t) const override { return !live; }
  };
  r.add(serving_loop_fault<ReusedPastTheWindow>("reused-past-the-window",
                                                "a prefix served from a released row whose first entries the window pushed out",
                                                check::kReusePastWindow), {"reference:reused-past-the-window"});

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
  r.add(serving_cache_fault<SavesOnlyTheWindow>("state-saved-without-history",
                                                "a row's state saved with its window only: a rollback after the restore has nothing to bring back",
                                                check::kRollbackAfterRestore), {"reference:state-saved-without-history", "llama.cpp:state-saved-without-history"});
}

}  // namespace tinygpt::checks::faults
