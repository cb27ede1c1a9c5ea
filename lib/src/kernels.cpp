// The kernels behind Kernels::Decode (see kernels.h for why they exist).
// matvec: y[r][n] = b[n] + sum_k x[r][k] w[n][k].
// Rows of w are split over LibTorch's intra-op threads; inside a thread, four weight rows at a
// time meet two input rows at a time, so each weight row is read from memory once and from L1
// for the other input rows. Sums run in eight lanes and are added at the end: a different order
// from BLAS, so results differ from at::linear by float rounding (~1e-6 on the model's logits),
// which the equivalence checks measure against the full forward.
#include "tinygpt/kernels.h"

#include "kernels_raw.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TINYGPT_HAVE_AVX2_PATH 1
#endif

namespace tinygpt {

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

// Dot products only: y[r][n] = x[r] . w[n] for n in [n0, n1). The epilogue adds the rest.
// Portable path: the same blocking with eight scalar lanes, for CPUs without AVX2/FMA.
void rows_generic(const float* w, const float* x, float* y, int64_t n0, int64_t n1, int64_t K, int64_t R, int64_t N) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t r = 0; r < R; ++r) y[r * N + n] = dot_lanes(w + n * K, x + r * K, K);
}

#ifdef TINYGPT_HAVE_AVX2_PATH
__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// The lane sums of four vectors at once, [sum a, sum b, sum c, sum d]: three horizontal adds and
// one add of the halves, where four hsum calls take sixteen instructions. In a short dot product
// (K = 64 in attention, 256 in most weight products) the reductions cost as much as the loop.
__attribute__((target("avx2,fma"))) inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  // lanes: a0-3, b0-3, c0-3, d0-3 (low half) and a4-7, b4-7, c4-7, d4-7 (high half)
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// out[i] = w_i . x for four consecutive weight rows w_0..w_3 of K floats (K % 8 == 0): four
// accumulators over the one vector, each summed across its lanes at the end.
// With Prefetch (the batch-1 product), the weights ahead are prefetched as they are consumed - two
// lines per step of the loop, kPrefetchBytes ahead of the block's progress through memory: spread
// over the loop a little ahead, the products read their weights as fast as a plain read of the same
// bytes, where a burst of prefetches per block fell short of it (docs/perf.md). The
// distance runs past a matrix's end into whatever follows (the model keeps its weights in one block
// in the order a step reads them: gpt.cpp); a prefetch never faults.
constexpr int64_t kPrefetchBytes = 16384;

template <bool Prefetch>
__attribute__((target("avx2,fma"))) inline void dot4_avx2(const float* w0, int64_t K, const float* x, float* out) {
  const char* ahead = reinterpret_cast<const char*>(w0) + kPrefetchBytes;
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
  for (int64_t k = 0; k < K; k += 8) {
    if constexpr (Prefetch) {
      _mm_prefetch(ahead + 16 * k, _MM_HINT_T0);
      _mm_prefetch(ahead + 16 * k + 64, _MM_HINT_T0);
    }
    const __m256 vx = _mm256_loadu_ps(x + k);
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), vx, c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + K + k), vx, c1);
    c2 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + 2 * K + k), vx, c2);
    c3 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + 3 * K + k), vx, c3);
  }
  _mm_storeu_ps(out, hsum4(c0, c1, c2, c3));
}

constexpr int64_t kPrefetchRows = 8;

// Keeps a loaded vector in its register: without it GCC folds the load into every FMA that uses
// the vector, so a weight row shared by three input rows was read three times from L1, and the
// loads, not the multiply-adds, set the pace.
#define TINYGPT_PIN(v) asm("" : "+x"(v))

// Four weight rows against three input rows: twelve accumulators, three input vectors and one
// weight vector at a time fill the sixteen ymm registers; 7 loads per 12 FMAs.
__attribute__((target("avx2,fma"))) inline void block4x3(const float* w0, int64_t K, const float* xa, const float* xb,
                                                          const float* xc, float* ya, float* yb, float* yc) {
  const float* w1 = w0 + K;
  const float* w2 = w1 + K;
  const float* w3 = w2 + K;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0, c0 = a0, c1 = a0,
         c2 = a0, c3 = a0;
  for (int64_t k = 0; k < K; k += 8) {
    __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k), vc = _mm256_loadu_ps(xc + k);
    TINYGPT_PIN(va);
    TINYGPT_PIN(vb);
    TINYGPT_PIN(vc);
    __m256 r = _mm256_loadu_ps(w0 + k);
    TINYGPT_PIN(r);
    a0 = _mm256_fmadd_ps(r, va, a0), b0 = _mm256_fmadd_ps(r, vb, b0), c0 = _mm256_fmadd_ps(r, vc, c0);
    r = _mm256_loadu_ps(w1 + k);
    TINYGPT_PIN(r);
    a1 = _mm256_fmadd_ps(r, va, a1), b1 = _mm256_fmadd_ps(r, vb, b1), c1 = _mm256_fmadd_ps(r, vc, c1);
    r = _mm256_loadu_ps(w2 + k);
    TINYGPT_PIN(r);
    a2 = _mm256_fmadd_ps(r, va, a2), b2 = _mm256_fmadd_ps(r, vb, b2), c2 = _mm256_fmadd_ps(r, vc, c2);
    r = _mm256_loadu_ps(w3 + k);
    TINYGPT_PIN(r);
    a3 = _mm256_fmadd_ps(r, va, a3), b3 = _mm256_fmadd_ps(r, vb, b3), c3 = _mm256_fmadd_ps(r, vc, c3);
  }
  _mm_storeu_ps(ya, hsum4(a0, a1, a2, a3));
  _mm_storeu_ps(yb, hsum4(b0, b1, b2, b3));
  _mm_storeu_ps(yc, hsum4(c0, c1, c2, c3));
}

// Four weight rows against two input rows (the remainder of the groups of three).
__attribute__((target("avx2,fma"))) inline void block4x2(const float* w0, int64_t K, const float* xa, const float* xb,
                                                          float* ya, float* yb) {
  const float* w1 = w0 + K;
  const float* w2 = w1 + K;
  const float* w3 = w2 + K;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (int64_t k = 0; k < K; k += 8) {
    __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
    __m256 r0 = _mm256_loadu_ps(w0 + k), r1 = _mm256_loadu_ps(w1 + k);
    __m256 r2 = _mm256_loadu_ps(w2 + k), r3 = _mm256_loadu_ps(w3 + k);
    TINYGPT_PIN(r0);
    TINYGPT_PIN(r1);
    TINYGPT_PIN(r2);
    TINYGPT_PIN(r3);
    a0 = _mm256_fmadd_ps(r0, va, a0), a1 = _mm256_fmadd_ps(r1, va, a1);
    a2 = _mm256_fmadd_ps(r2, va, a2), a3 = _mm256_fmadd_ps(r3, va, a3);
    b0 = _mm256_fmadd_ps(r0, vb, b0), b1 = _mm256_fmadd_ps(r1, vb, b1);
    b2 = _mm256_fmadd_ps(r2, vb, b2), b3 = _mm256_fmadd_ps(r3, vb, b3);
  }
  _mm_storeu_ps(ya, hsum4(a0, a1, a2, a3));
  _mm_storeu_ps(yb, hsum4(b0, b1, b2, b3));
}

// y[r][n0..n1) for every input row: blocks of four weight rows, each met by the input rows in
// groups of three (then two, then one) while it sits in L1. Every output is the same sum in the
// same eight lanes whichever group computes it. Needs K % 8 == 0 (checked by the caller); the
// last n1 % 4 rows go to the generic path. With more than one input row, the block kPrefetchRows
// rows ahead is prefetched at the block's start (the hardware prefetcher, seeing four short
// interleaved streams, leaves the products well short of a plain read's bandwidth: docs/perf.md);
// a single input row prefetches inside its loop instead (dot4_avx2<true>).
__attribute__((target("avx2,fma"))) void rows_avx2(const float* w, const float* x, float* y, int64_t n0, int64_t n1,
                                                   int64_t K, int64_t R, int64_t N) {
  int64_t n = n0;
  if (R == 1) {
    for (; n + 4 <= n1; n += 4) dot4_avx2<true>(w + n * K, K, x, y + n);
    if (n < n1) rows_generic(w, x, y, n, n1, K, R, N);
    return;
  }
  for (; n + 4 <= n1; n += 4) {
    const float* w0 = w + n * K;
    if (n + kPrefetchRows + 4 <= n1) {
      const char* next = reinterpret_cast<const char*>(w0 + kPrefetchRows * K);
      for (int64_t off = 0; off < 4 * K * 4; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
    }
    int64_t r = 0;
    for (; r + 3 <= R; r += 3) {
      const float* xa = x + r * K;
      block4x3(w0, K, xa, xa + K, xa + 2 * K, y + r * N + n, y + (r + 1) * N + n, y + (r + 2) * N + n);
    }
    if (R - r == 2) block4x2(w0, K, x + r * K, x + (r + 1) * K, y + r * N + n, y + (r + 1) * N + n);
    else if (R - r == 1) dot4_avx2<false>(w0, K, x + r * K, y + r * N + n);
  }
  if (n < n1) rows_generic(w, x, y, n, n1, K, R, N);
}
#undef TINYGPT_PIN

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

// The path in force: TINYGPT_KERNELS at first use, else the widest the CPU runs; set_kernel_path
// changes it (tests and the bench run each path in turn).
std::atomic<int>& path_in_force() {
  static std::atomic<int> path{[] {
    const auto available = kernel_paths_available();
    const char* env = std::getenv("TINYGPT_KERNELS");
    if (env && *env) {
      const KernelPath p = kernel_path_from_string(env);  // an unknown name is refused
      if (std::find(available.begin(), available.end(), p) == available.end())
        throw std::invalid_argument(std::string("TINYGPT_KERNELS=") + env + ": this CPU cannot run the " + env + " path");
      return static_cast<int>(p);
    }
    return static_cast<int>(available.back());
  }()};
  return path;
}

#ifdef TINYGPT_HAVE_AVX2_PATH
// The AVX2/FMA code runs: the CPU has it and the path in force is it.
bool avx2_in_force() { return path_in_force().load(std::memory_order_relaxed) == static_cast<int>(KernelPath::Avx2); }
#endif

// GELU, exact erf form, of one float: (x / 2) (1 + erf(x / sqrt 2)), written the way LibTorch's
// vectorised GELU writes it (ATen's Vectorized<float>::erf: Abramowitz & Stegun 7.1.26, |erf error|
// < 1.5e-7), with exp by the Cephes polynomial (within 2 ulp) where ATen calls Sleef. at::gelu on a
// 1024-wide row cost 10 us inside a decode step here (dispatch, allocation, and Sleef's exp), 60 us
// of a 750-us batch-1 step; this runs in the products' epilogue while the row is in L1. Every
// element goes through the same operations whatever its neighbours (the vector path finishes a row
// with a masked vector, not a scalar tail), so a row's values do not depend on the batch.
// The portable path: the same formula in scalar code.
constexpr float kErfP = 0.3275911f, kErfA1 = 0.254829592f, kErfA2 = -0.284496736f, kErfA3 = 1.421413741f,
                kErfA4 = -1.453152027f, kErfA5 = 1.061405429f;
constexpr float kExpHi = 88.3762626647949f, kExpLo = -88.3762626647949f, kLog2e = 1.44269504088896341f,
                kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f, kExpP1 = 1.3981999507e-3f, kExpP2 = 8.3334519073e-3f,
                kExpP3 = 4.1665795894e-2f, kExpP4 = 1.6666665459e-1f, kExpP5 = 5.0000001201e-1f;
constexpr float kSqrtHalf = 0.70710678118654752f;

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

#ifdef TINYGPT_HAVE_AVX2_PATH
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(kExpP0), x, _mm256_set1_ps(kExpP1));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpP2));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpP3));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpP4));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpP5));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), _mm256_set1_ps(1.0f));
  // 2^n through the exponent bits; n >= -127 here, and n = -127 gives 0 (below the normal range).
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

__attribute__((target("avx2,fma"))) inline __m256 gelu_avx2(__m256 x) {
  const __m256 neg_zero = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 a = _mm256_mul_ps(x, _mm256_set1_ps(kSqrtHalf));
  const __m256 sign = _mm256_and_ps(neg_zero, a);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(kErfP), _mm256_xor_ps(sign, a), one));
  __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(kErfA5), t, _mm256_set1_ps(kErfA4));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kErfA3));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kErfA2));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kErfA1));
  const __m256 e = _mm256_xor_ps(neg_zero, exp_avx2(_mm256_xor_ps(neg_zero, _mm256_mul_ps(a, a))));  // -exp(-a^2)
  const __m256 erf = _mm256_xor_ps(sign, _mm256_fmadd_ps(_mm256_mul_ps(e, t), r, one));
  return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)), _mm256_add_ps(one, erf));
}

// The lanes of the last, partial vector of a row: the first `left` (1 to 7) set.
__attribute__((target("avx2,fma"))) inline __m256i tail_mask(int64_t left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2,fma"))) void gelu_row_avx2(float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu_avx2(_mm256_loadu_ps(y + i)));
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, mask, gelu_avx2(_mm256_maskload_ps(y + i, mask)));
  }
}
#endif

}  // namespace

namespace raw {

void gelu(float* y, int64_t n) {
#ifdef TINYGPT_HAVE_AVX2_PATH
  if (avx2_in_force()) {
    gelu_row_avx2(y, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_one(y[i]);
}

void matvec(const float* xp, const float* wp, const float* bp, const float* rp, float* yp, int64_t R, int64_t K, int64_t N,
            bool apply_gelu) {
#ifdef TINYGPT_HAVE_AVX2_PATH
  const bool avx2 = avx2_in_force() && K % 8 == 0;
#endif
  // Blocks of four weight rows; a thread gets at least ~32k multiply-adds, so a fork (a few
  // microseconds, much more on shared cores) never costs more than the work it splits.
  const int64_t grain = std::max<int64_t>(16, (32768 + 4 * K * R - 1) / (4 * K * R));
  at::parallel_for(0, (N + 3) / 4, grain, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * 4, n1 = std::min(N, b1 * 4);
#ifdef TINYGPT_HAVE_AVX2_PATH
    if (avx2) rows_avx2(wp, xp, yp, n0, n1, K, R, N);
    else
#endif
      rows_generic(wp, xp, yp, n0, n1, K, R, N);
    // Epilogue while the outputs are in cache, in the library's order: (dot + bias), GELU,
    // residual + that.
    if (!bp && !rp && !apply_gelu) return;
    for (int64_t r = 0; r < R; ++r) {
      float* y = yp + r * N;
      if (bp)
        for (int64_t n = n0; n < n1; ++n) y[n] += bp[n];
      if (apply_gelu) raw::gelu(y + n0, n1 - n0);
      if (rp)
        for (int64_t n = n0; n < n1; ++n) y[n] = rp[r * N + n] + y[n];
    }
  });
}

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

namespace {

at::Tensor matvec(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& residual, bool apply_gelu) {
  auto f32_cpu = [](const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kFloat && t.device().is_cpu(); };
  if (!f32_cpu(x) || x.dim() != 2 || !f32_cpu(w) || w.dim() != 2 || x.size(1) != w.size(1) || !w.is_contiguous())
    throw std::invalid_argument("matvec: needs x (R, K) and contiguous w (N, K), float32 on the CPU");
  if (b.defined() && (!f32_cpu(b) || b.dim() != 1 || b.size(0) != w.size(0) || !b.is_contiguous()))
    throw std::invalid_argument("matvec: bias must be a contiguous float32 (N) CPU tensor");
  if (residual.defined() && (!f32_cpu(residual) || residual.dim() != 2 || residual.size(0) != x.size(0) ||
                             residual.size(1) != w.size(0)))
    throw std::invalid_argument("matvec: residual must be a float32 (R, N) CPU tensor");
  const at::Tensor xc = x.contiguous();
  const at::Tensor rc = residual.defined() ? residual.contiguous() : residual;
  const int64_t R = xc.size(0), K = xc.size(1), N = w.size(0);
  at::Tensor y = at::empty({R, N}, xc.options());  // (R, N)
  // With GELU the residual comes after it: residual + GELU(x w^T + b).
  raw::matvec(xc.data_ptr<float>(), w.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
              rc.defined() ? rc.data_ptr<float>() : nullptr, y.data_ptr<float>(), R, K, N, apply_gelu);
  return y;
}

at::Tensor layer_norm_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  const int64_t d = x.size(-1), R = x.numel() / d;
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  raw::layer_norm(xc.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), static_cast<float>(eps),
                  y.data_ptr<float>(), R, d);
  return y;
}

}  // namespace

const char* to_string(Kernels k) {
  switch (k) {
    case Kernels::Decode: return "decode";
    default: return "library";
  }
}

at::Tensor matvec(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) { return matvec(x, w, b, {}, false); }

at::Tensor decode_gelu(const at::Tensor& x) {
  if (!x.defined() || x.scalar_type() != at::kFloat || !x.device().is_cpu())
    throw std::invalid_argument("decode_gelu: needs a float32 CPU tensor");
  at::Tensor y = x.contiguous().clone();
  raw::gelu(y.data_ptr<float>(), y.numel());
  return y;
}

namespace {
bool decodable(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const int64_t K = x.size(-1), rows = K > 0 ? x.numel() / K : 0;
  return rows >= 1 && rows <= kMatvecMaxRows && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
         w.scalar_type() == at::kFloat && w.is_contiguous() && (!b.defined() || b.is_contiguous());
}
}  // namespace

at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Kernels k, const at::Tensor& residual,
                   bool apply_gelu) {
  if (k == Kernels::Decode && decodable(x, w, b) && (!residual.defined() || residual.scalar_type() == at::kFloat)) {
    const int64_t K = x.size(-1), rows = x.numel() / K;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = w.size(0);
    at::Tensor res = residual.defined() ? residual.reshape({rows, w.size(0)}) : residual;
    return matvec(x.reshape({rows, K}), w, b, res, apply_gelu).view(shape);  // (..., N)
  }
  at::Tensor y = at::linear(x, w, b);
  if (apply_gelu) y = at::gelu(y);  // exact erf form
  return residual.defined() ? residual + y : y;
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, Kernels k) {
  const int64_t d = x.size(-1), rows = d > 0 ? x.numel() / d : 0;
  if (k == Kernels::Decode && rows >= 1 && rows <= kMatvecMaxRows && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
      w.scalar_type() == at::kFloat && b.defined() && b.scalar_type() == at::kFloat && w.is_contiguous() && b.is_contiguous())
    return layer_norm_rows(x, w, b, eps);
  return at::layer_norm(x, {d}, w, b, eps);
}

namespace {

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

#ifdef TINYGPT_HAVE_AVX2_PATH
constexpr int64_t kAttentionMaxVectors = 16;  // hd up to 128 keeps the output row in registers

// The same function with AVX2/FMA, for hd % 8 == 0 and hd <= 8 x kAttentionMaxVectors: eight keys'
// dot products at a time, the exponentials and the weights eight at a time, and the output row held
// in registers while the values stream by. The scalar row took ~22% of a batch-16 decode step for
// ~10% of its arithmetic, and the four-key vector row with a scalar exp ~15% of a batch-1 step.
// Sums in another order than the portable row's (the exp's sum in eight lanes), so the two differ
// by float rounding; a CPU runs one of them.
__attribute__((target("avx2,fma"))) void attention_row_avx2(const float* q, const float* k, int64_t ks, const float* v,
                                                            int64_t vs, float* y, int64_t S, int64_t hd, float scale,
                                                            float* p) {
  const int64_t nv = hd / 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  // Scores, eight keys at a time: eight independent chains of multiply-adds hide their latency
  // (four keys left the loop waiting on it); each score is still its key's eight-lane sum.
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t s = 0;
  for (; s + 8 <= S; s += 8) {
    const float* k0 = k + s * ks;
    __m256 c[8];
    for (int i = 0; i < 8; ++i) c[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < hd; j += 8) {
      const __m256 vq = _mm256_loadu_ps(q + j);
      for (int i = 0; i < 8; ++i) c[i] = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i * ks + j), vq, c[i]);
    }
    const __m256 sc = _mm256_div_ps(
        _mm256_insertf128_ps(_mm256_castps128_ps256(hsum4(c[0], c[1], c[2], c[3])), hsum4(c[4], c[5], c[6], c[7]), 1), vscale);
    _mm256_storeu_ps(p + s, sc);
    vmax = _mm256_max_ps(vmax, sc);
  }
  float m = -INFINITY;
  {
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (float l : lanes) m = std::max(m, l);
  }
  for (; s < S; ++s) {
    const float* kr = k + s * ks;
    __m256 a = _mm256_setzero_ps();
    for (int64_t j = 0; j < hd; j += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(kr + j), _mm256_loadu_ps(q + j), a);
    p[s] = hsum(a) / scale;
    m = std::max(m, p[s]);
  }
  // exp(score - max) eight at a time (the GELU's exp: within 2 ulp of std::exp, which cost ~15 ns a
  // key), their sum in eight lanes, then the weights exp / sum; the tail through a masked vector.
  const __m256 vm = _mm256_set1_ps(m);
  __m256 vz = _mm256_setzero_ps();
  for (s = 0; s + 8 <= S; s += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(p + s), vm));
    _mm256_storeu_ps(p + s, e);
    vz = _mm256_add_ps(vz, e);
  }
  if (s < S) {
    const __m256i mask = tail_mask(S - s);
    const __m256 e = _mm256_and_ps(exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(p + s, mask), vm)), _mm256_castsi256_ps(mask));
    _mm256_maskstore_ps(p + s, mask, e);
    vz = _mm256_add_ps(vz, e);
  }
  const float z = hsum(vz);
  const __m256 vsum = _mm256_set1_ps(z);
  for (s = 0; s + 8 <= S; s += 8) _mm256_storeu_ps(p + s, _mm256_div_ps(_mm256_loadu_ps(p + s), vsum));
  for (; s < S; ++s) p[s] /= z;
  // y = sum_s p[s] V[s], the output row in registers.
  __m256 acc[kAttentionMaxVectors];
  for (int64_t j = 0; j < nv; ++j) acc[j] = _mm256_setzero_ps();
  for (s = 0; s < S; ++s) {
    const __m256 w = _mm256_set1_ps(p[s]);
    const float* vr = v + s * vs;
    for (int64_t j = 0; j < nv; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8 * j), acc[j]);
  }
  for (int64_t j = 0; j < nv; ++j) _mm256_storeu_ps(y + 8 * j, acc[j]);
}
#endif

}  // namespace

namespace raw {

void attention_row(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, float* y, int64_t S, int64_t hd,
                   float* p) {
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(hd)));
#ifdef TINYGPT_HAVE_AVX2_PATH
  if (avx2_in_force() && hd % 8 == 0 && hd / 8 <= kAttentionMaxVectors) {
    attention_row_avx2(q, k, ks, v, vs, y, S, hd, scale, p);
    return;
  }
#endif
  attention_row_generic(q, k, ks, v, vs, y, S, hd, scale, p);
}

}  // namespace raw

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V) {
  auto ok = [](const at::Tensor& t) {
    return t.defined() && t.dim() == 4 && t.scalar_type() == at::kFloat && t.device().is_cpu() && t.stride(3) == 1;
  };
  if (!ok(q) || !ok(K) || !ok(V) || q.size(2) != 1 || K.sizes() != V.sizes() || q.size(0) != K.size(0) ||
      q.size(1) != K.size(1) || q.size(3) != K.size(3))
    throw std::invalid_argument("decode_attention: needs q (B, H, 1, hd) and K, V (B, H, S, hd), float32 CPU");
  const int64_t B = q.size(0), H = q.size(1), S = K.size(2), hd = q.size(3);
  at::Tensor y = at::empty({B, H, 1, hd}, q.options());  // (B, H, 1, hd) contiguous
  const float* qp = q.data_ptr<float>();
  const float* kp = K.data_ptr<float>();
  const float* vp = V.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(static_cast<size_t>(S));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / H, h = r % H;
      raw::attention_row(qp + b * q.stride(0) + h * q.stride(1), kp + b * K.stride(0) + h * K.stride(1), K.stride(2),
                         vp + b * V.stride(0) + h * V.stride(1), V.stride(2), yp + r * hd, S, hd, p.data());
    }
  });
  return y;
}


at::Tensor attend(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask, Kernels k) {
  if (k == Kernels::Decode && !mask.defined() && q.size(2) == 1 && q.device().is_cpu() &&
      q.scalar_type() == at::kFloat && K.scalar_type() == at::kFloat && V.scalar_type() == at::kFloat &&
      q.stride(3) == 1 && K.stride(3) == 1 && V.stride(3) == 1)
    return decode_attention(q, K, V);
  const double hd = static_cast<double>(q.size(-1));
  at::Tensor att = at::matmul(q, K.transpose(-2, -1)) / std::sqrt(hd);  // (B, H, T, S)
  if (mask.defined()) att = att + mask;
  return at::matmul(at::softmax(att, -1), V);  // (B, H, T, hd)
}

const char* to_string(KernelPath p) { return p == KernelPath::Avx2 ? "avx2" : "portable"; }

KernelPath kernel_path_from_string(const std::string& name) {
  if (name == "portable") return KernelPath::Portable;
  if (name == "avx2") return KernelPath::Avx2;
  throw std::invalid_argument("unknown kernel path '" + name + "' (portable, avx2)");
}

std::vector<KernelPath> kernel_paths_available() {
  std::vector<KernelPath> out = {KernelPath::Portable};
#ifdef TINYGPT_HAVE_AVX2_PATH
  if (cpu_has_avx2_fma()) out.push_back(KernelPath::Avx2);
#endif
  return out;
}

KernelPath kernel_path() { return static_cast<KernelPath>(path_in_force().load()); }

void set_kernel_path(KernelPath p) {
  const auto available = kernel_paths_available();
  if (std::find(available.begin(), available.end(), p) == available.end())
    throw std::invalid_argument(std::string("this CPU cannot run the ") + to_string(p) + " kernel path");
  path_in_force().store(static_cast<int>(p));
}

}  // namespace tinygpt
