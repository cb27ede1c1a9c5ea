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

namespace tinygpt {

struct RopeScaling {
  enum class Kind { None, Linear, Llama3, Yarn };
  Kind kind = Kind::None;
  double factor = 1;                 // linear, llama3, YaRN: how far the context is stretched
  double low_freq_factor = 1;        // llama3
  double high_freq_factor = 4;       // llama3
  int64_t original_context = 0;      // llama3, YaRN: the context the model was trained at
  double beta_fast = 32;             // YaRN: the correction range's ends, in rotations
  double beta_slow = 1;
  std::optional<double> attention_factor;  // YaRN: given, or 0.1 ln(factor) + 1 (1 when factor <= 1)
  bool truncate = true;              // YaRN: the correction range rounded out to whole dimensions
};

struct RopeSpec {
  double theta = 10000;
  int64_t head_dim = 64;
  double partial_rotary = 1.0;  // the rotated fraction of each head (GPT-NeoX's rotary_pct)
  RopeScaling scaling;
  // The rotated width: floor(head_dim x partial_rotary), even.
  int64_t rotated() const;
};

// "none", "linear", "llama3", "yarn" and back; std::invalid_argument naming the known kinds.
const char* to_string(RopeScaling::Kind k);
RopeScaling::Kind rope_scaling_kind(const std::string& name);

// std::invalid_argument("rope: <field> ...") on the first field out of its domain: theta <= 1, a
// rotated width that is odd or zero, a factor <= 0, llama3's high_freq_factor <= low_freq_factor,
// an original context < 1 where the kind reads it, beta_fast <= beta_slow.
void validate(const RopeSpec& spec);

// The inverse frequencies f_j, j < rotated() / 2: (rotated / 2) float32 on the CPU, computed with the
// float32 operations of transformers 5.12's modeling_rope_utils.py in its order (SPEC 10 states them).
at::Tensor rope_inv_frequencies(const RopeSpec& spec);

// What cos and sin are multiplied by: YaRN's attention factor, 1 for every other kind.
double rope_attention_factor(const RopeSpec& spec);

// Which channels turn together: (2j, 2j+1) - ours, SPEC 2, llama.cpp's NORM - or (j, j + r/2) -
// transformers' rotate_half, Llama, Qwen3, Gemma, GPT-NeoX, llama.cpp's NEOX. Pair j turns by f_j.
enum class RopePairing { Adjacent, Halves };

// x (..., T, hd) rotated at `positions` (T) int64, each row t at positions[t]: the first
// spec.rotated() channels in pairs by angle positions[t] x f_j, cos and sin multiplied by the attention
// factor, the other channels passed through. In float32 with transformers' operations and order for
// Halves (x cos + rotate_half(x) sin); Adjacent is the same rotation on interleaved channels. Returns
// x's shape and dtype.
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& positions, const RopeSpec& spec, RopePairing pairing);

}  // namespace tinygpt
