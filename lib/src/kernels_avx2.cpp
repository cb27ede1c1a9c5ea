// The AVX2/FMA path of the decode kernels (kernels_paths.h). Each function carries its own target
// attribute, so the file builds for any x86-64 and runs only where the CPU has AVX2 and FMA
// (kernels.cpp checks before calling). Empty elsewhere.
#include "kernels_paths.h"

#ifdef TINYGPT_HAVE_AVX2_PATH

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace tinygpt::paths {

namespace {

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
// in the order a step reads them: pack_parameters, kernel_step.h); a prefetch never faults.
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

}  // namespace

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

namespace {

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

}  // namespace

__attribute__((target("avx2,fma"))) void gelu_row_avx2(float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu_avx2(_mm256_loadu_ps(y + i)));
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, mask, gelu_avx2(_mm256_maskload_ps(y + i, mask)));
  }
}

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

}  // namespace tinygpt::paths

#endif  // TINYGPT_HAVE_AVX2_PATH
