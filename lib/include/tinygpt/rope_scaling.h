// RoPE for the architectures of the zoo (SPEC 10): the frequencies - the base theta, the rotated width
// (partial rotary), and the scalings transformers implements: linear, llama3 and YaRN, with YaRN's
// attention factor - and the rotation with either pairing of channels. The seed's RoPE (SPEC 2,
// rope.h) is theta 10000 over the whole head, adjacent pairs, no scaling, and keeps its own code, so
// its goldens hold bit for bit; this is what a model with other knobs rotates by.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "tinygpt/config.h"

namespace tinygpt {

struct RopeSpec {
  double theta = 10000;
  int64_t head_dim = 64;
  double partial_rotary = 1.0;  // the rotated fraction of each head (GPT-NeoX's rotary_pct)
  RopeScaling scaling;
  // The rotated width: floor(head_dim x partial_rotary), even.
  int64_t rotated() const;
};

// RoPE's knobs of `c` as a spec (theta, head_dim, partial rotary, scaling).
RopeSpec rope_spec(const Config& c);
// Whether `c`'s RoPE is the seed's (SPEC 2: theta 10000, the whole head, adjacent pairs, no scaling),
// which keeps its own code (rope.h) and its bits.
bool is_seed_rope(const Config& c);

// std::invalid_argument("rope: <field> ...") on the first field out of its domain: theta <= 1, a
// rotated width that is odd or zero, a factor <= 0, llama3's high_freq_factor <= low_freq_factor,
// an original context < 1 where the kind reads it, beta_fast <= beta_slow.
void validate(const RopeSpec& spec);

// The inverse frequencies f_j, j < rotated() / 2: (rotated / 2) float32 on the CPU, computed with the
// float32 operations of transformers 5.12's modeling_rope_utils.py in its order (SPEC 10 states them).
at::Tensor rope_inv_frequencies(const RopeSpec& spec);

// What cos and sin are multiplied by: YaRN's attention factor, 1 for every other kind.
double rope_attention_factor(const RopeSpec& spec);


// One model's rotation, its frequencies computed once (a decode step rotates with a table lookup and
// two products, not the scaling's arithmetic again).
class Rotation {
 public:
  Rotation(const RopeSpec& spec, RopePairing pairing);  // validates the spec
  // x (..., T, hd) rotated at `positions`: (T) int64, row t at positions[t]; or (B, T) for x
  // (B, H, T, hd), each batch row at positions of its own. The first spec.rotated() channels turn in
  // pairs by angle p x f_j, cos and sin multiplied by the attention factor, the other channels pass
  // through. In float32 with transformers' operations and order for Halves (x cos + rotate_half(x)
  // sin); Adjacent is the same rotation on interleaved channels. Returns x's shape and dtype.
  at::Tensor apply(const at::Tensor& x, const at::Tensor& positions) const;
  // x (..., T, hd), already rotated, turned on by `delta` positions with the same frequencies and
  // WITHOUT the attention factor (a rotation composes; the factor was applied once): a context
  // shift's re-rotation of cached keys. Returns x's shape and dtype.
  at::Tensor turn(const at::Tensor& x, int64_t delta) const;
  const RopeSpec& spec() const { return spec_; }
  RopePairing pairing() const { return pairing_; }

 private:
  RopeSpec spec_;
  RopePairing pairing_;
  at::Tensor rotate(const at::Tensor& x, const at::Tensor& angles, double factor) const;
  at::Tensor inv_freq_;  // (r/2) float32, CPU
  double factor_;
};

// Rotation(spec, pairing).apply(x, positions).
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& positions, const RopeSpec& spec, RopePairing pairing);

}  // namespace tinygpt
