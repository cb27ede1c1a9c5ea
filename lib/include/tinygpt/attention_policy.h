// The two decisions an attention call makes besides arithmetic: how the new tokens are
// positioned (RoPE) and which keys each query may see (the mask). Production behaviour is
// the base class; a harness may pass another implementation to the cached path to model a
// bug, so the model itself carries no fault branches.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <cstdint>

namespace tinygpt {

class AttentionPolicy {
 public:
  virtual ~AttentionPolicy() = default;

  // q, k, v: (B, H, T, hd) for tokens at positions start .. start+T-1.
  // Production: RoPE on q and k with that start; v is never rotated.
  virtual void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start) const;
  // The same for rows at positions of their own (a ragged batch): positions (B, T) int64.
  virtual void position_rows(at::Tensor& q, at::Tensor& k, at::Tensor& v, const at::Tensor& positions) const;

  // Additive mask for tq queries over tk keys, (tq, tk) with 0 or -inf, or an undefined
  // tensor for "no mask". The queries are the LAST tq of the tk positions, so query i may see
  // key j iff j <= tk - tq + i (bottom-right aligned). Production: no mask when tq == 1.
  virtual at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts) const;
};

// Production policy, shared and stateless.
const AttentionPolicy& production_policy();

// The window reference of SPEC 4: query i sees keys j with i - window < j <= i (bottom-right
// aligned). A full forward with window = context + 1 computes, at every position, exactly what
// the rolling cache computes, including past the window, with no cache at all.
class BandedPolicy final : public AttentionPolicy {
 public:
  explicit BandedPolicy(int64_t window);
  at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts) const override;

 private:
  int64_t window_;
};

// Builds a (tq, tk) additive mask: 0 where key j is visible to query i, -inf elsewhere, for
// queries aligned to the last tq keys; `window` <= 0 means unbounded on the left.
at::Tensor causal_mask(int64_t tq, int64_t tk, int64_t window, const c10::TensorOptions& opts);

// softmax(q K^T / sqrt(hd) + mask) V in LibTorch ops, the attention the mask feeds: q (B, H, T, hd), K and V (B, H, S, hd), mask
// (T, S) additive, broadcastable to (B, H, T, S), or undefined. Returns (B, H, T, hd).
at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask);

}  // namespace tinygpt
