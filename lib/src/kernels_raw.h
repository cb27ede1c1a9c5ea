// The decode kernels on raw float32 CPU buffers: what kernels.cpp's tensor entry points and the
// fused decode step (fused_step.cpp) both call, so the two compute bit for bit the same. Private to
// the model library. No checks here: the callers validate shapes, dtypes and devices.
#pragma once

#include <cstdint>

namespace tinygpt::raw {

// y (R, N) = x (R, K) . w (N, K)^T, then + b (N) when not null, then GELU when asked, then
// residual (R, N) + that when not null; rows split over LibTorch's intra-op threads. y may alias
// neither x nor residual.
void matvec(const float* x, const float* w, const float* b, const float* residual, float* y, int64_t R, int64_t K,
            int64_t N, bool apply_gelu = false);

// LayerNorm of each of R rows of d floats with weight and bias (d). y may not alias x.
void layer_norm(const float* x, const float* w, const float* b, float eps, float* y, int64_t R, int64_t d);

// One query row against S keys and values: y (hd) = softmax(q . k_s / sqrt(hd)) V. Strides between
// keys and between values in floats; p is scratch for S scores.
void attention_row(const float* q, const float* k, int64_t key_stride, const float* v, int64_t value_stride, float* y,
                   int64_t S, int64_t hd, float* p);

// GELU (exact erf form, LibTorch's vector formula; kernels.cpp says how) of n floats in place,
// each element independent of the ones beside it.
void gelu(float* y, int64_t n);

// RoPE of one row of hd floats by cos and sin (hd / 2): pairs (2j, 2j+1) -> (a cos - b sin, a sin + b cos).
// out may alias in.
void rope_row(const float* in, const float* cos, const float* sin, float* out, int64_t hd);

}  // namespace tinygpt::raw
