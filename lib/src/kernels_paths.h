// The decode kernels' two code paths on raw float32 buffers, a file each: kernels_portable.cpp
// (eight scalar lanes, any CPU) and kernels_avx2.cpp (AVX2/FMA, built on x86-64 with GCC or Clang,
// run where the CPU has it). Both block and sum in the same order; they differ by float rounding
// (FMA rounds once where the portable path rounds twice). kernels.cpp picks one per call (the path
// in force, kernels.h) and splits the work over threads. Private to the model library; no checks
// here: the callers validate shapes, dtypes and devices.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TINYGPT_HAVE_AVX2_PATH 1
#endif

namespace tinygpt::paths {

// GELU, exact erf form, of one float: (x / 2) (1 + erf(x / sqrt 2)), written the way LibTorch's
// vectorised GELU writes it (ATen's Vectorized<float>::erf: Abramowitz & Stegun 7.1.26, |erf error|
// < 1.5e-7), with exp by the Cephes polynomial (within 2 ulp) where ATen calls Sleef. at::gelu on a
// 1024-wide row cost 10 us inside a decode step here (dispatch, allocation, and Sleef's exp), 60 us
// of a 750-us batch-1 step; this runs in the products' epilogue while the row is in L1. Every
// element goes through the same operations whatever its neighbours (the vector path finishes a row
// with a masked vector, not a scalar tail), so a row's values do not depend on the batch.
// Both paths compute this formula; these are its constants.
constexpr float kErfP = 0.3275911f, kErfA1 = 0.254829592f, kErfA2 = -0.284496736f, kErfA3 = 1.421413741f,
                kErfA4 = -1.453152027f, kErfA5 = 1.061405429f;
constexpr float kExpHi = 88.3762626647949f, kExpLo = -88.3762626647949f, kLog2e = 1.44269504088896341f,
                kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f, kExpP1 = 1.3981999507e-3f, kExpP2 = 8.3334519073e-3f,
                kExpP3 = 4.1665795894e-2f, kExpP4 = 1.6666665459e-1f, kExpP5 = 5.0000001201e-1f;
constexpr float kSqrtHalf = 0.70710678118654752f;

// --- portable (kernels_portable.cpp) ---

// y[r][n] = x[r] . w[n] for n in [n0, n1) and every input row r < R: x (R, K), w (N, K), y (R, N).
void rows_generic(const float* w, const float* x, float* y, int64_t n0, int64_t n1, int64_t K, int64_t R, int64_t N);
// GELU of n floats in place, each by the scalar formula.
void gelu_row_portable(float* y, int64_t n);
// One query row against S keys and values: y (hd) = softmax(q . k_s / scale) V; strides in floats,
// p scratch for S scores.
void attention_row_generic(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, float* y, int64_t S,
                           int64_t hd, float scale, float* p);

#ifdef TINYGPT_HAVE_AVX2_PATH
// --- AVX2/FMA (kernels_avx2.cpp) ---

bool cpu_has_avx2_fma();
// rows_generic's function, for K % 8 == 0.
void rows_avx2(const float* w, const float* x, float* y, int64_t n0, int64_t n1, int64_t K, int64_t R, int64_t N);
// gelu_row_portable's function, eight at a time (a masked vector for the tail).
void gelu_row_avx2(float* y, int64_t n);
constexpr int64_t kAttentionMaxVectors = 16;  // hd up to 128 keeps the output row in registers
// attention_row_generic's function, for hd % 8 == 0 and hd <= 8 x kAttentionMaxVectors.
void attention_row_avx2(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, float* y, int64_t S,
                        int64_t hd, float scale, float* p);
#endif

}  // namespace tinygpt::paths
