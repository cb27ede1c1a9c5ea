#include "tinygpt/attention_policy.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "tinygpt/config.h"
#include "tinygpt/rope.h"

namespace tinygpt {

void Rotary::rotate(at::Tensor& q, at::Tensor& k, int64_t start) const {
  // One table lookup serves q and k: the same positions.
  auto [cos, sin] = rope_angles(start, q.size(-2), q.size(-1), q.device());  // (T, hd/2) each
  q = rope_rotate(q, cos, sin);
  k = rope_rotate(k, cos, sin);
}

void Rotary::rotate_rows(at::Tensor& q, at::Tensor& k, const at::Tensor& positions) const {
  // One gather of the table's rows serves q and k: the same positions.
  auto [cos, sin] = rope_row_angles(positions, q.size(-1), q.device());  // (B * T, hd/2) each
  q = rope_rotate(q, cos, sin);
  k = rope_rotate(k, cos, sin);
}

at::Tensor Rotary::rotate_one(const at::Tensor& x, int64_t start) const { return rope(x, start); }

RopePairing Rotary::pairing() const { return RopePairing::Adjacent; }

const Rotary& seed_rotary() {
  static const Rotary r;
  return r;
}

void AttentionPolicy::position(at::Tensor& q, at::Tensor& k, at::Tensor& /*v*/, int64_t start, const Rotary& rotary) const {
  rotary.rotate(q, k, start);
}

void AttentionPolicy::position_rows(at::Tensor& q, at::Tensor& k, at::Tensor& /*v*/, const at::Tensor& positions,
                                    const Rotary& rotary) const {
  rotary.rotate_rows(q, k, positions);
}

at::Tensor AttentionPolicy::mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const {
  // One query is the newest token: it may see every key, so no mask (SPEC 4). A top-left
  // aligned causal mask here would hide all keys but the first (the seed's gotcha 2).
  if (tq == 1 && (window <= 0 || tk <= window)) return at::Tensor();
  return causal_mask(tq, tk, window, opts);
}

const AttentionPolicy& production_policy() {
  static const AttentionPolicy policy;
  return policy;
}

BandedPolicy::BandedPolicy(int64_t window) : window_(window) {
  if (window < 1) throw std::invalid_argument("BandedPolicy: window must be >= 1");
}

at::Tensor BandedPolicy::mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const {
  return causal_mask(tq, tk, window > 0 ? std::min(window, window_) : window_, opts);
}

at::Tensor causal_mask(int64_t tq, int64_t tk, int64_t window, const c10::TensorOptions& opts) {
  if (tq < 1 || tk < tq) throw std::invalid_argument("causal_mask: need 1 <= tq <= tk");
  const auto i64 = opts.dtype(at::kLong);
  at::Tensor qpos = at::arange(tk - tq, tk, i64).unsqueeze(1);  // (tq, 1) absolute query index
  at::Tensor kpos = at::arange(0, tk, i64).unsqueeze(0);        // (1, tk)
  at::Tensor visible = kpos <= qpos;
  if (window > 0) visible = visible & (kpos > qpos - window);
  return at::zeros({tq, tk}, opts).masked_fill(visible.logical_not(),
                                               -std::numeric_limits<double>::infinity());
}

at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask) {
  const double hd = static_cast<double>(q.size(-1));
  at::Tensor att = at::matmul(q, K.transpose(-2, -1)) / std::sqrt(hd);  // (B, H, T, S)
  if (mask.defined()) att = att + mask;
  return at::matmul(at::softmax(att, -1), V);  // (B, H, T, hd)
}

}  // namespace tinygpt
