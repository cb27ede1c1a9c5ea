// The portable path of the decode kernels (kernels_paths.h): the AVX2 path's blocking and order of
// summation in eight scalar lanes, for CPUs without AVX2/FMA; and the LayerNorm both paths use.
#include <algorithm>
#include <cmath>

#include "kernels_paths.h"
#include "kernels_raw.h"

namespace tinygpt {
namespace paths {

namespace {

// a . b over n floats in eight scalar lanes, added at the end, then the tail: the portable
// paths' order of summation (the vector paths sum in the same eight lanes).
inline float dot_lanes(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) lane[j] += a[k + j] * b[k + j];
  float s = 0;
  for (int j = 0; j < 8; ++j) s += lane[j];
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

float exp_poly(float x) {
  x = std::min(std::max(x, kExpLo), kExpHi);
  const float n = std::floor(std::fma(x, kLog2e, 0.5f));
  x = std::fma(-n, kLn2Hi, x);
  x = std::fma(-n, kLn2Lo, x);
  const float z = x * x;
  float y = std::fma(kExpP0, x, kExpP1);
  y = std::fma(y, x, kExpP2);
  y = std::fma(y, x, kExpP3);
  y = std::fma(y, x, kExpP4);
  y = std::fma(y, x, kExpP5);
  y = std::fma(y, z, x) + 1.0f;
  return y * std::ldexp(1.0f, static_cast<int>(n));
}

float gelu_one(float x) {
  const float a = x * kSqrtHalf;
  const float t = 1.0f / std::fma(kErfP, std::fabs(a), 1.0f);
  float r = std::fma(kErfA5, t, kErfA4);
  r = std::fma(r, t, kErfA3);
  r = std::fma(r, t, kErfA2);
  r = std::fma(r, t, kErfA1);
  const float e = std::copysign(std::fma(-exp_poly(-(a * a)) * t, r, 1.0f), a);
  return x * 0.5f * (1.0f + e);
}

}  // namespace

// Dot products only: y[r][n] = x[r] . w[n] for n in [n0, n1). The epilogue adds the rest.
// Portable path: the same blocking with eight scalar lanes, for CPUs without AVX2/FMA.
void rows_generic(const float* w, const float* x, float* y, int64_t n0, int64_t n1, int64_t K, int64_t R, int64_t N) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t r = 0; r < R; ++r) y[r * N + n] = dot_lanes(w + n * K, x + r * K, K);
}

void gelu_row_portable(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_one(y[i]);
}

// One (batch, head) row of decode attention: y = softmax(q . k_s / sqrt(hd)) V over S keys.
// Strides are in floats; p is scratch for S scores. The scores as the reference computes them:
// (q . k) / sqrt(hd), then a max-shifted softmax, then the weights times the values.
void attention_row_generic(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, float* y, int64_t S,
                           int64_t hd, float scale, float* p) {
  float m = -INFINITY;
  for (int64_t s = 0; s < S; ++s) {
    p[s] = dot_lanes(q, k + s * ks, hd) / scale;
    m = std::max(m, p[s]);
  }
  float z = 0;
  for (int64_t s = 0; s < S; ++s) z += (p[s] = std::exp(p[s] - m));
  for (int64_t j = 0; j < hd; ++j) y[j] = 0;
  for (int64_t s = 0; s < S; ++s) {
    const float w = p[s] / z;
    const float* vr = v + s * vs;
    for (int64_t j = 0; j < hd; ++j) y[j] += w * vr[j];
  }
}

}  // namespace paths

namespace raw {

void layer_norm(const float* xp, const float* wp, const float* bp, float eps, float* yp, int64_t R, int64_t d) {
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = xp + r * d;
    float* yr = yp + r * d;
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j + 8 <= d; j += 8)
      for (int l = 0; l < 8; ++l) lane[l] += xr[j + l];
    float sum = 0;
    for (int l = 0; l < 8; ++l) sum += lane[l];
    for (int64_t j = d - d % 8; j < d; ++j) sum += xr[j];
    const float mean = sum / static_cast<float>(d);
    float sq[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j + 8 <= d; j += 8)
      for (int l = 0; l < 8; ++l) sq[l] += (xr[j + l] - mean) * (xr[j + l] - mean);
    float var = 0;
    for (int l = 0; l < 8; ++l) var += sq[l];
    for (int64_t j = d - d % 8; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(d) + eps);
    for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - mean) * inv * wp[j] + bp[j];
  }
}

}  // namespace raw

}  // namespace tinygpt
