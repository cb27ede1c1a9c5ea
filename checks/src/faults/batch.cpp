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
      store(l, K.roll(1, 0), V.roll(1, 0));  // rows rolled along the batch (dim 0)
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
      if (prefill)
        store(l, K.roll(1, 0), V.roll(1, 0));
      else
        store(l, K, V);
      return {K, V};
    }
  };
  r.add(cache_fault<PrefillRowsShifted>("prefill-rows-shifted", "the prompt's entries stored one row off (admission into the wrong slot)",
                                        {check::kBatch}));
}

}  // namespace tinygpt::checks::faults
