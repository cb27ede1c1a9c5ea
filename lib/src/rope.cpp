#include "tinygpt/rope.h"

#include "kernels_raw.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace tinygpt {

namespace {

void check_args(const at::Tensor& x, int64_t start) {
  if (x.dim() < 2) throw std::invalid_argument("rope: x must be (..., T, hd)");
  if (x.size(-1) % 2 != 0) throw std::invalid_argument("rope: head_dim must be even, got " + std::to_string(x.size(-1)));
  if (start < 0) throw std::invalid_argument("rope: start must be >= 0, got " + std::to_string(start));
}

// SPEC 2's angles for positions start .. start+T-1: (T, hd/2) float32.
// SPEC 2's frequencies 10000^(-2j/hd): (hd/2) float32.
at::Tensor freqs_for(int64_t hd, const at::TensorOptions& f32) {
  return at::pow(10000.0, -at::arange(0, hd, 2, f32) / static_cast<double>(hd));
}

at::Tensor angles_for(int64_t start, int64_t T, int64_t hd, const at::TensorOptions& f32) {
  at::Tensor pos = at::arange(start, start + T, f32).unsqueeze(1);  // (T, 1)
  return pos * freqs_for(hd, f32);                                  // (T, hd/2)
}

// The rotation with LibTorch ops, any device and layout.
at::Tensor rotate_ops(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t hd = x.size(-1);
  at::Tensor pairs = x.to(at::kFloat).unflatten(-1, {hd / 2, 2});  // (..., T, hd/2, 2)
  at::Tensor a = pairs.select(-1, 0), b = pairs.select(-1, 1);
  at::Tensor ra = a * cos - b * sin;
  at::Tensor rb = a * sin + b * cos;
  return at::stack({ra, rb}, -1).flatten(-2).to(x.scalar_type());  // (..., T, hd)
}

// The same arithmetic in one pass for a 4-D CPU float32 x whose last dim is contiguous. Each
// product and difference is its own statement, so no compiler fuses them into an FMA: the result
// is bit-identical to rotate_ops.
// cos, sin: (T, hd/2), shared by every row of x, or (B * T, hd/2), row b * T + t for x's row b (rope_rows).
at::Tensor rotate_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), hd = x.size(3), half = hd / 2;
  at::Tensor out = at::empty({B, H, T, hd}, x.options());  // (B, H, T, hd) contiguous
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t sb = x.stride(0), sh = x.stride(1), st = x.stride(2);
  const bool per_row = c.size(0) != T;
  at::parallel_for(0, B * H * T, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T, h = (r / T) % H, b = r / (T * H), a = per_row ? b * T + t : t;
      const float* in = xp + b * sb + h * sh + t * st;
      float* o = op + r * hd;
      raw::rope_row(in, cp + a * half, sp + a * half, o, hd);
    }
  });
  return out;
}

}  // namespace

namespace raw {

// Each product and difference is its own statement, so no compiler fuses them into an FMA: the
// result is bit-identical to rotate_ops.
void rope_row(const float* in, const float* cr, const float* sr, float* o, int64_t hd) {
  for (int64_t j = 0; j < hd / 2; ++j) {
    const float a = in[2 * j], bb = in[2 * j + 1];
    const float ac = a * cr[j];
    const float bs = bb * sr[j];
    const float as = a * sr[j];
    const float bc = bb * cr[j];
    o[2 * j] = ac - bs;
    o[2 * j + 1] = as + bc;
  }
}

}  // namespace raw

namespace {

struct Table {
  at::Tensor cos, sin;  // (P, hd/2)
};

}  // namespace

at::Tensor rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t T = x.size(-2);
  if (cos.dim() != 2 || !cos.sizes().equals(sin.sizes()) || cos.size(1) * 2 != x.size(-1) ||
      (cos.size(0) != T && (x.dim() != 4 || cos.size(0) != x.size(0) * T)))
    throw std::invalid_argument("rope: cos and sin must be (T, hd/2), or (B * T, hd/2) for x (B, H, T, hd)");
  if (x.dim() == 4 && x.device().is_cpu() && x.scalar_type() == at::kFloat && x.stride(3) == 1 &&
      cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat)
    return rotate_fused(x, cos, sin);
  if (x.dim() == 4 && cos.size(0) != x.size(2)) {  // a row's own angles: (B * T, hd/2) -> (B, 1, T, hd/2)
    const std::vector<int64_t> rows = {x.size(0), 1, x.size(2), cos.size(1)};
    return rotate_ops(x, cos.view(rows), sin.view(rows));
  }
  return rotate_ops(x, cos, sin);
}

at::Tensor rope(const at::Tensor& x, int64_t start) {
  check_args(x, start);
  at::Tensor ang = angles_for(start, x.size(-2), x.size(-1), x.options().dtype(at::kFloat));
  return rotate_ops(x, ang.cos(), ang.sin());
}

std::pair<at::Tensor, at::Tensor> rope_angles(int64_t start, int64_t T, int64_t hd, c10::Device device) {
  if (hd % 2 != 0 || hd < 2) throw std::invalid_argument("rope: head_dim must be even, got " + std::to_string(hd));
  if (start < 0 || T < 0) throw std::invalid_argument("rope: start must be >= 0, got " + std::to_string(start));
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  if (start + T > kRopeTableMax) {
    at::Tensor ang = angles_for(start, T, hd, f32);
    return {ang.cos(), ang.sin()};
  }
  static std::mutex mu;
  static std::map<std::pair<std::string, int64_t>, Table> tables;
  Table t;
  {
    std::lock_guard<std::mutex> lock(mu);
    Table& slot = tables[{device.str(), hd}];
    if (!slot.cos.defined() || slot.cos.size(0) < start + T) {
      int64_t P = slot.cos.defined() ? slot.cos.size(0) : 1024;
      while (P < start + T) P *= 2;
      // Rows p of the table equal angles_for(p, 1, ...): the same float32 product p * freq_j.
      at::Tensor ang = angles_for(0, std::min(P, kRopeTableMax), hd, f32);
      slot = {ang.cos(), ang.sin()};
    }
    t = slot;
  }
  return {t.cos.narrow(0, start, T), t.sin.narrow(0, start, T)};
}

at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& positions) {
  if (x.dim() != 4 || positions.dim() != 2 || positions.size(0) != x.size(0) || positions.size(1) != x.size(2))
    throw std::invalid_argument("rope_rows: x must be (B, H, T, hd) and positions (B, T)");
  check_args(x, 0);
  const auto [cos, sin] = rope_row_angles(positions, x.size(-1), x.device());  // (B * T, hd/2)
  return rope_rotate(x, cos, sin);
}

std::pair<at::Tensor, at::Tensor> rope_row_angles(const at::Tensor& positions, int64_t hd, c10::Device device) {
  if (positions.numel() == 0) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    return {at::empty({0, hd / 2}, f32), at::empty({0, hd / 2}, f32)};
  }
  const at::Tensor flat = positions.reshape({-1}).to(at::kLong);
  const int64_t lo = flat.min().item<int64_t>(), hi = flat.max().item<int64_t>();
  if (lo < 0) throw std::invalid_argument("rope_rows: positions must be >= 0");
  if (hi < kRopeTableMax) {  // the table's rows: each position's angles exactly as a row rotated alone gets them
    const auto [cos, sin] = rope_angles(0, hi + 1, hd, device);
    const at::Tensor at_rows = flat.to(device);
    return {cos.index_select(0, at_rows), sin.index_select(0, at_rows)};
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor ang = flat.to(f32).unsqueeze(-1) * freqs_for(hd, f32);  // (B * T, hd/2)
  return {ang.cos(), ang.sin()};
}

}  // namespace tinygpt
