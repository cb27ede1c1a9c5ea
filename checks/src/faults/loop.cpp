// The generation loop's bookkeeping (DecodeSchedule): each fault one decision of generate_cached
// changed - positions, the prefill's tokens, reset, the sampler's history - the cache kept right.
#include <ATen/ATen.h>

#include "fault.h"

namespace tinygpt::checks::faults {

void register_loop_faults(FaultFile& r) {
  // `pos % context`: the position counter wraps when the window is full.
  class WrappedPositions final : public DecodeSchedule {
   public:
    int64_t position(int64_t fed, int64_t context) const override { return fed % context; }
  };
  r.add(remedy(loop_fault<WrappedPositions>("loop-wrapped-positions", "the loop wraps positions at the window (pos % context)",
                                     {check::kWindowReference, check::kLongPrompt}),
                "positions wrap at the window: keep counting past the context (SPEC 4)"), {"transformers:positions-restart"});

  // `min(pos, context - 1)`: the position counter stops growing at the window's last slot.
  class ClampedPositions final : public DecodeSchedule {
   public:
    int64_t position(int64_t fed, int64_t context) const override { return std::min(fed, context - 1); }
  };
  r.add(remedy(loop_fault<ClampedPositions>("loop-clamped-positions", "the loop's positions stop growing at the window's last slot",
                                     {check::kWindowReference, check::kLongPrompt}),
                "positions stop growing at the window's last slot: keep counting past the context (SPEC 4)"));

  // `min(pos, context)`: the positions stop growing at the context itself, one past the window's last
  // slot (transformers.js's position ids, derived from an attention mask its trimmed cache keeps at
  // `context` entries). Right up to position context; every token after sits at `context`.
  class PositionsStopAtContext final : public DecodeSchedule {
   public:
    int64_t position(int64_t fed, int64_t context) const override { return std::min(fed, context); }
  };
  r.add(remedy(loop_fault<PositionsStopAtContext>("loop-positions-stop-at-context",
                                           "the loop's positions stop growing at the context (transformers.js's own position ids)",
                                           {check::kWindowReference}),
                "the positions stop growing at the context: count them from the tokens fed, not from the trimmed cache's length or "
                   "attention mask"));

  // The position read before it counts the previous token: each decode token is fed at the
  // previous token's position (the loop's off-by-one; the attention policy is correct).
  class LoopPositionOffByOne final : public DecodeSchedule {
   public:
    int64_t position(int64_t fed, int64_t) const override { return fed - 1; }
  };
  r.add(loop_fault<LoopPositionOffByOne>("loop-pos-off-by-one", "the loop feeds each decode token at the previous token's position",
                                         {check::kLogits, check::kWindowReference, check::kLongPrompt}));

  // `prompt[:, :context]` for `prompt[:, -context:]`: a prompt longer than the window is prefilled
  // from its start instead of its end.
  class PrefillFromTheStart final : public DecodeSchedule {
   public:
    int64_t prefill_start(int64_t, int64_t) const override { return 0; }
  };
  r.add(loop_fault<PrefillFromTheStart>("loop-prefill-offset", "a prompt longer than the window is prefilled from its start, not its end",
                                        {check::kLongPrompt}));

  // The loop never calls reset(): a server's second request decodes on top of the first one's
  // keys and values.
  class LoopWithoutReset final : public DecodeSchedule {
   public:
    void begin(KVCache&) const override {}
  };
  r.add(loop_fault<LoopWithoutReset>("loop-no-reset", "the loop forgets to reset the cache between calls", {check::kReset}));

  // The chooser is handed only the generated tokens, not the prompt: the repetition penalty forgets
  // the prompt. Logits stay right; only sampled runs with a penalty show it.
  class HistoryWithoutPrompt final : public DecodeSchedule {
   public:
    at::Tensor history(const at::Tensor& seq, int64_t prompt_len) const override {
      return seq.narrow(1, prompt_len, seq.size(1) - prompt_len);
    }
  };
  r.add(loop_fault<HistoryWithoutPrompt>("loop-history-no-prompt", "the sampler's history leaves out the prompt (penalty forgets it)",
                                         {check::kSampled}));
}

}  // namespace tinygpt::checks::faults
