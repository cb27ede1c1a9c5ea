// The two decisions an attention call makes besides arithmetic: how the new tokens are
// positioned (RoPE) and which keys each query may see (the mask). Production behaviour is
// the base class; a harness may pass another implementation to the cached path to model a
// bug, so the model itself carries no fault branches.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <cstdint>

namespace tinygpt {

struct RopeSpec;
enum class RopePairing;

// How a model turns positions into rotations of q and k: the seed's RoPE (SPEC 2) is this base class;
// a zoo member's scaled, partial or half-paired RoPE (SPEC 10) another (gpt.h's make_rotary).
class Rotary {
 public:
  virtual ~Rotary() = default;
  // q (B, H, T, hd) and k (B, G, T, hd) rotated for positions start .. start+T-1.
  virtual void rotate(at::Tensor& q, at::Tensor& k, int64_t start) const;
  // The same for rows at positions of their own: positions (B, T) int64.
  virtual void rotate_rows(at::Tensor& q, at::Tensor& k, const at::Tensor& positions) const;
  // One tensor (B, *, T, hd) rotated for start .. start+T-1.
  virtual at::Tensor rotate_one(const at::Tensor& x, int64_t start) const;
  // A zoo member's RoPE as a spec (rope_scaling.h) and its pairing, for whoever must rotate as it
  // does with one thing changed (a fault); null for the seed's.
  virtual const RopeSpec* spec() const { return nullptr; }
  virtual RopePairing pairing() const;
};

// The seed's, shared and stateless.
const Rotary& seed_rotary();

class AttentionPolicy {
 public:
  virtual ~AttentionPolicy() = default;

  // q (B, H, T, hd), k and v (B, G, T, hd) for tokens at positions start .. start+T-1; `rotary` is the
  // model's RoPE. Production: rotary on q and k with that start; v is never rotated.
  virtual void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start, const Rotary& rotary) const;
  // The same for rows at positions of their own (a ragged batch): positions (B, T) int64.
  virtual void position_rows(at::Tensor& q, at::Tensor& k, at::Tensor& v, const at::Tensor& positions,
                             const Rotary& rotary) const;

  // Additive mask for tq queries over tk keys, (tq, tk) with 0 or -inf, or an undefined tensor for
  // "no mask". The queries are the LAST tq of the tk positions, so query i may see key j iff
  // j <= tk - tq + i (bottom-right aligned) and, in a layer with a sliding window w > 0 (SPEC 10;
  // 0 for a full layer), j > tk - tq + i - w. Production: no mask when tq == 1 and the window does
  // not cut the keys.
  virtual at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const;
};

// Production policy, shared and stateless.
const AttentionPolicy& production_policy();

// The window reference of SPEC 4: query i sees keys j with i - window < j <= i (bottom-right
// aligned), and a sliding layer's own window where that is narrower. A full forward with window =
// context + 1 computes, at every position, exactly what the rolling cache computes, including past
// the window, with no cache at all.
class BandedPolicy final : public AttentionPolicy {
 public:
  explicit BandedPolicy(int64_t window);
  at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const override;

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
