// RoPE's frequencies for the zoo (rope_scaling.h, SPEC 10). Each formula is transformers 5.12's
// (modeling_rope_utils.py, and the models' default), written with the same float32 operations in the
// same order - Python's `1.0 / t` is t.reciprocal() * 1.0, `1 - t` is rsub - so the tensors agree to
// the bit where LibTorch's kernels do (tests/zoo/rope_scaling_vs_transformers.py measures it).
#include "tinygpt/rope_scaling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tinygpt {

namespace {

constexpr double kPi = 3.14159265358979323846;

std::string num(double x) {
  std::string s = std::to_string(x);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// theta ** (arange(0, r, 2) / r): (r / 2) float32, transformers' `pos_freqs`.
at::Tensor powers(double theta, int64_t r) {
  const at::Tensor e = at::arange(0, r, 2, at::kLong).to(at::kFloat) / static_cast<double>(r);  // (r/2)
  return at::pow(theta, e);
}

}  // namespace

int64_t RopeSpec::rotated() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary); }

bool is_seed_rope(const Config& c) {
  const Config seed;
  return c.rope_theta == seed.rope_theta && c.partial_rotary == seed.partial_rotary && c.rope_pairing == seed.rope_pairing &&
         c.rope_scaling == seed.rope_scaling;
}

RopeSpec rope_spec(const Config& c) {
  RopeSpec s;
  s.theta = c.rope_theta;
  s.head_dim = c.head_dim();
  s.partial_rotary = c.partial_rotary;
  s.scaling = c.rope_scaling;
  return s;
}

void validate(const RopeSpec& s) {
  if (!(s.theta > 1)) throw std::invalid_argument("rope: theta must be > 1, got " + num(s.theta));
  if (s.head_dim < 2) throw std::invalid_argument("rope: head_dim must be >= 2, got " + std::to_string(s.head_dim));
  if (!(s.partial_rotary > 0 && s.partial_rotary <= 1))
    throw std::invalid_argument("rope: partial_rotary must be in (0, 1], got " + num(s.partial_rotary));
  const int64_t r = s.rotated();
  if (r < 2 || r % 2 != 0)
    throw std::invalid_argument("rope: the rotated width head_dim x partial_rotary = " + std::to_string(r) + " must be even and >= 2");
  const RopeScaling& c = s.scaling;
  if (c.kind == RopeScaling::Kind::None) return;
  const std::string kind = to_string(c.kind);
  if (!(c.factor > 0)) throw std::invalid_argument("rope: " + kind + " factor must be > 0, got " + num(c.factor));
  if (c.kind == RopeScaling::Kind::Llama3 || c.kind == RopeScaling::Kind::Yarn) {
    if (c.original_context < 1)
      throw std::invalid_argument("rope: " + kind + " needs the original context (>= 1), got " + std::to_string(c.original_context));
  }
  if (c.kind == RopeScaling::Kind::Llama3) {
    if (!(c.low_freq_factor > 0)) throw std::invalid_argument("rope: llama3 low_freq_factor must be > 0, got " + num(c.low_freq_factor));
    if (!(c.high_freq_factor > c.low_freq_factor))
      throw std::invalid_argument("rope: llama3 high_freq_factor (" + num(c.high_freq_factor) + ") must exceed low_freq_factor (" +
                                  num(c.low_freq_factor) + ")");
  }
  if (c.kind == RopeScaling::Kind::Yarn) {
    if (!(c.beta_slow > 0) || !(c.beta_fast > c.beta_slow))
      throw std::invalid_argument("rope: yarn needs beta_fast > beta_slow > 0, got " + num(c.beta_fast) + " and " + num(c.beta_slow));
    if (c.attention_factor && !(*c.attention_factor > 0))
      throw std::invalid_argument("rope: yarn attention_factor must be > 0, got " + num(*c.attention_factor));
  }
}

at::Tensor rope_inv_frequencies(const RopeSpec& s) {
  validate(s);
  const int64_t r = s.rotated();
  const RopeScaling& c = s.scaling;
  const at::Tensor base = at::reciprocal(powers(s.theta, r));  // (r/2): 1 / theta^(2j/r)
  switch (c.kind) {
    case RopeScaling::Kind::None: return base;
    case RopeScaling::Kind::Linear: return base / c.factor;
    case RopeScaling::Kind::Llama3: {
      const double C = static_cast<double>(c.original_context);
      const double low_wavelen = C / c.low_freq_factor, high_wavelen = C / c.high_freq_factor;
      const at::Tensor wavelen = at::reciprocal(base) * (2 * kPi);                           // 2 pi / f
      at::Tensor f = at::where(wavelen > low_wavelen, base / c.factor, base);                 // long waves: / factor
      const at::Tensor smooth = (at::reciprocal(wavelen) * C - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
      const at::Tensor smoothed = at::rsub(smooth, 1) * f / c.factor + smooth * f;
      const at::Tensor medium = at::logical_not(wavelen < high_wavelen) * at::logical_not(wavelen > low_wavelen);
      return at::where(medium, smoothed, f);
    }
    case RopeScaling::Kind::Yarn: {
      const at::Tensor pos = powers(s.theta, r);
      const at::Tensor extrapolation = at::reciprocal(pos);
      const at::Tensor interpolation = at::reciprocal(pos * c.factor);
      const double C = static_cast<double>(c.original_context), R = static_cast<double>(r);
      auto dim_of = [&](double rotations) { return R * std::log(C / (rotations * 2 * kPi)) / (2 * std::log(s.theta)); };
      double low = dim_of(c.beta_fast), high = dim_of(c.beta_slow);
      if (c.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0);
      high = std::min(high, R - 1);
      if (low == high) high += 0.001;  // no zero-width ramp
      const at::Tensor ramp = at::clamp((at::arange(r / 2, at::kFloat) - low) / (high - low), 0, 1);  // (r/2)
      const at::Tensor keep = at::rsub(ramp, 1);  // transformers' extrapolation factor
      return interpolation * at::rsub(keep, 1) + extrapolation * keep;
    }
  }
  return base;
}

double rope_attention_factor(const RopeSpec& s) {
  validate(s);
  const RopeScaling& c = s.scaling;
  if (c.kind != RopeScaling::Kind::Yarn) return 1.0;
  if (c.attention_factor) return *c.attention_factor;
  return c.factor <= 1 ? 1.0 : 0.1 * std::log(c.factor) + 1.0;
}

Rotation::Rotation(const RopeSpec& spec, RopePairing pairing) : spec_(spec), pairing_(pairing) {
  validate(spec_);
  inv_freq_ = rope_inv_frequencies(spec_);
  factor_ = rope_attention_factor(spec_);
}

at::Tensor Rotation::apply(const at::Tensor& x, const at::Tensor& positions) const {
  const int64_t hd = x.size(-1);
  if (x.dim() < 2 || hd != spec_.head_dim)
    throw std::invalid_argument("rope: x must be (..., T, " + std::to_string(spec_.head_dim) + "), got last dim " + std::to_string(hd));
  const bool rows = positions.dim() == 2;
  if (rows ? (x.dim() != 4 || positions.size(0) != x.size(0) || positions.size(1) != x.size(2))
           : (positions.dim() != 1 || positions.size(0) != x.size(-2)))
    throw std::invalid_argument("rope: positions must be (T) for x (..., T, hd), or (B, T) for x (B, H, T, hd)");
  const at::Tensor f = inv_freq_.to(x.device());                                      // (r/2)
  at::Tensor angles = positions.to(x.device()).to(at::kFloat).unsqueeze(-1) * f;       // (T, r/2) or (B, T, r/2): one product each
  if (rows) angles = angles.unsqueeze(1);                                              // (B, 1, T, r/2)
  return rotate(x, angles, factor_);
}

at::Tensor Rotation::turn(const at::Tensor& x, int64_t delta) const {
  if (x.dim() < 2 || x.size(-1) != spec_.head_dim)
    throw std::invalid_argument("rope: x must be (..., T, " + std::to_string(spec_.head_dim) + ")");
  const at::Tensor angles = inv_freq_.to(x.device()) * static_cast<double>(delta);  // (r/2)
  return rotate(x, angles, 1.0);
}

// x (..., T, hd) by `angles` broadcastable to (..., T, r/2), cos and sin times `factor`.
at::Tensor Rotation::rotate(const at::Tensor& x, const at::Tensor& angles, double factor) const {
  const int64_t hd = x.size(-1), r = spec_.rotated();
  const at::Tensor emb = at::cat({angles, angles}, -1);                                // (..., T, r)
  const at::Tensor cos = emb.cos() * factor, sin = emb.sin() * factor;
  const at::Tensor xf = x.to(at::kFloat);
  at::Tensor rot = xf.narrow(-1, 0, r);                                                // (..., T, r)
  if (pairing_ == RopePairing::Adjacent)  // channels (2j, 2j+1) -> (j, j + r/2), rotated, and back
    rot = rot.unflatten(-1, {r / 2, 2}).transpose(-1, -2).flatten(-2);
  const at::Tensor half = at::cat({at::neg(rot.narrow(-1, r / 2, r / 2)), rot.narrow(-1, 0, r / 2)}, -1);  // rotate_half
  at::Tensor out = rot * cos + half * sin;                                              // (..., T, r)
  if (pairing_ == RopePairing::Adjacent) out = out.unflatten(-1, {2, r / 2}).transpose(-1, -2).flatten(-2);
  if (r < hd) out = at::cat({out, xf.narrow(-1, r, hd - r)}, -1);
  return out.to(x.scalar_type());
}

at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& positions, const RopeSpec& s, RopePairing pairing) {
  return Rotation(s, pairing).apply(x, positions);
}

}  // namespace tinygpt
