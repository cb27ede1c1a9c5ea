// Rotary position embedding with a start position (SPEC 2), computed in float32.
// `rope` is the formula as SPEC 2 states it, kept as the oracle; the model uses `rope_angles`,
// a table of cos and sin computed once and grown as positions do, with the same float32
// operations, so both give the same values bit for bit (tested).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <utility>

namespace tinygpt {

// x: (..., T, hd) with hd even, any floating dtype. Rotates channel pairs (2j, 2j+1)
// of row t by angle (start + t) * 10000^(-2j/hd). Returns a tensor of x's shape and dtype.
at::Tensor rope(const at::Tensor& x, int64_t start);

// cos and sin of (start + t) * 10000^(-2j/hd) for t < T: two (T, hd/2) float32 tensors on
// `device`. Rows come from a per-(hd, device) table (thread-safe, grown by doubling up to
// kRopeTableMax positions; beyond that they are computed on the fly the same way).
std::pair<at::Tensor, at::Tensor> rope_angles(int64_t start, int64_t T, int64_t hd, c10::Device device);
constexpr int64_t kRopeTableMax = int64_t{1} << 16;

// Rows at positions of their own (a ragged batch): x (B, H, T, hd), positions (B, T) int64 >= 0. The
// angles are rope_angles' rows for those positions, so a row rotated here equals that row rotated alone.
at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& positions);
// The angles rope_rows rotates by: cos and sin (B * T, hd/2) float32 on `device`, row b * T + t those of
// positions[b][t] (positions (B, T) int64 >= 0: std::invalid_argument otherwise).
std::pair<at::Tensor, at::Tensor> rope_row_angles(const at::Tensor& positions, int64_t hd, c10::Device device);

// Rotates x (..., T, hd) by cos, sin (T, hd/2), or x (B, H, T, hd) by each row's own (B * T, hd/2)
// (rope_row_angles): (a, b) -> (a cos - b sin, a sin + b cos), in float32, then back to x's dtype.
// CPU float32 runs one fused loop; elsewhere LibTorch ops.
at::Tensor rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace tinygpt
