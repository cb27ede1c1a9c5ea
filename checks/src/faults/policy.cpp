// How new tokens are positioned and which keys a query sees (AttentionPolicy): each fault one
// method of the policy changed, on the model's own step.
#include <ATen/ATen.h>

#include "fault.h"
#include "tinygpt/rope.h"

namespace tinygpt::checks::faults {

void register_policy_faults(FaultFile& r) {
  // Part 2's rope() built its table from arange(T): a decode step (T=1) lands at position 0.
  class RopeOffset final : public AttentionPolicy {
   public:
    void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t, const Rotary& r) const override {
      AttentionPolicy::position(q, k, v, 0, r);
    }
  };
  r.add(remedy(seed_fault(policy_fault<RopeOffset>("rope-offset", "decode step rotates q and k as if at position 0 (seed gotcha 1)", in_window), 7),
                "decode steps are rotated as if at position 0: pass the row's position to RoPE"), {"reference:rope-offset", "onnxruntime:positions-restart"});

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
  r.add(remedy(seed_fault(policy_fault<TopLeftMask>("topleft-mask", "decode query under a top-left causal mask sees only key 0 (seed gotcha 2)", in_window), 3),
                "the single decode query is masked top-left: align the causal mask bottom-right"));

  // The attention layer rotates a decode token one position early (its own off-by-one; the loop's
  // counter is right).
  class DecodePositionOffByOne final : public AttentionPolicy {
   public:
    void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start, const Rotary& r) const override {
      AttentionPolicy::position(q, k, v, (q.size(2) == 1 && start > 0) ? start - 1 : start, r);
    }
  };
  r.add(policy_fault<DecodePositionOffByOne>("decode-pos-off-by-one", "attention rotates decode tokens one position early", in_window));

  // The rotation applied to all three of q, k, v (a copy-paste of the q/k line).
  class RopeOnValues final : public AttentionPolicy {
   public:
    void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start, const Rotary& r) const override {
      AttentionPolicy::position(q, k, v, start, r);
      v = r.rotate_one(v, start);
    }
  };
  r.add(policy_fault<RopeOnValues>("rope-on-v", "RoPE applied to values as well as queries and keys", in_window));

  // is_causal=T > 1 written as is_causal=False: the prefill's queries see later prompt tokens.
  class PrefillWithoutMask final : public AttentionPolicy {
   public:
    at::Tensor mask(int64_t, int64_t, const c10::TensorOptions&, int64_t) const override { return at::Tensor(); }
  };
  r.add(policy_fault<PrefillWithoutMask>("prefill-no-mask", "prefill run without the causal mask", in_window));
}

}  // namespace tinygpt::checks::faults
