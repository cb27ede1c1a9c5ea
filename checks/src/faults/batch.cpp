// A batch's rows in one cache (KVCache): invisible at batch 1.
#include <ATen/ATen.h>

#include "fault.h"

namespace tinygpt::checks::faults {

void register_batch_faults(FaultFile& r) {
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
  r.add(cache_fault<RowsMixed>("rows-mixed", "row b's keys and values stored as row b+1's", {check::kBatch}));

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
  r.add(cache_fault<PrefillRowsShifted>("prefill-rows-shifted", "the prompt's entries stored one row off (admission into the wrong slot)",
                                        {check::kBatch}));
}

}  // namespace tinygpt::checks::faults
