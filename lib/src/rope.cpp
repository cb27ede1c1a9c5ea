#include "tinygpt/rope.h"

#include <ATen/ATen.h>
#include <stdexcept>
#include <string>

namespace tinygpt {

at::Tensor rope(const at::Tensor& x, int64_t start) {
  if (x.dim() < 2) throw std::invalid_argument("rope: x must be (..., T, hd)");
  const int64_t T = x.size(-2), hd = x.size(-1);
  if (hd % 2 != 0) throw std::invalid_argument("rope: head_dim must be even, got " + std::to_string(hd));
  if (start < 0) throw std::invalid_argument("rope: start must be >= 0, got " + std::to_string(start));
  const auto f32 = x.options().dtype(at::kFloat);
  // freq_j = 10000^(-2j/hd), angle = p * freq_j, all float32 as the series computes them.
  at::Tensor freqs = at::pow(10000.0, -at::arange(0, hd, 2, f32) / static_cast<double>(hd));  // (hd/2)
  at::Tensor pos = at::arange(start, start + T, f32).unsqueeze(1);                           // (T, 1)
  at::Tensor angles = pos * freqs;                                                           // (T, hd/2)
  at::Tensor cos = angles.cos(), sin = angles.sin();
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor pairs = xf.unflatten(-1, {hd / 2, 2});  // (..., T, hd/2, 2)
  at::Tensor a = pairs.select(-1, 0), b = pairs.select(-1, 1);
  at::Tensor ra = a * cos - b * sin;
  at::Tensor rb = a * sin + b * cos;
  return at::stack({ra, rb}, -1).flatten(-2).to(x.scalar_type());  // (..., T, hd)
}

}  // namespace tinygpt
