// Which code runs the decode step's arithmetic. The series runs PyTorch ops everywhere; at decode
// time those hand BLAS tiny shapes it handles poorly: a one-row weight product costs several times
// the reading of its weight, and a one-query attention matmul spends its time in OpenBLAS's packing
// routines for a few kFLOP of work (docs/perf.md has the figures).
// Kernels::Decode replaces those, and fuses the small steps around them:
//  - the weight products: each weight row streamed once and multiplied against every input row
//    (up to kMatvecMaxRows) while it sits in L1; four weight rows by three input rows per inner
//    loop (then two, then one), AVX2/FMA where the CPU has it;
//  - the attention of one query over the cached keys with no mask: one pass per (batch, head);
//  - LayerNorm, and the bias, GELU and residual add folded into the products' epilogues (each
//    LibTorch op costs microseconds of dispatch and allocation; a decode step had ~170 of them).
//    The GELU is LibTorch's vector formula (A&S 7.1.26 erf) with an exp of our own: within a few
//    ulp of at::gelu, not equal to it.
// RoPE and the cache are the same code for both. Leaves out reduced precision: float32 only.
#pragma once

#include <ATen/core/Tensor.h>
#include <cstdint>
#include <string>
#include <vector>

namespace tinygpt {

enum class Kernels {
  Library,  // LibTorch ops everywhere (BLAS for products and attention): the series' arithmetic
  Decode,   // our kernels for CPU float32 decode shapes; LibTorch for everything else
};

// Up to this many rows (B x T) the matvec kernel beats OpenBLAS (docs/perf.md); longer prefills go
// to BLAS, whose blocking wins there.
constexpr int64_t kMatvecMaxRows = 16;
// Up to this many rows a product still runs the kernel, in blocks of kMatvecMaxRows (a batch's verify
// step: four rows of k + 1 = 9 tokens are 36; measured 1.07-1.22x the batched step through OpenBLAS at
// k = 4, docs/perf.md).
constexpr int64_t kMatvecBlockedMaxRows = 4 * kMatvecMaxRows;

const char* to_string(Kernels k);

// The code path of Decode's kernels: AVX2/FMA, or the portable one (the same blocking and order
// with scalar lanes) for CPUs without it. The widest the CPU runs is in force unless
// TINYGPT_KERNELS=portable|avx2 names another at start; tests and `tinygpt bench --kernels` switch
// between them, so one machine runs every path it can execute. The paths agree to within float
// rounding, not bitwise (FMA rounds once where the portable path rounds twice).
enum class KernelPath { Portable, Avx2 };
const char* to_string(KernelPath p);
// std::invalid_argument naming the known paths.
KernelPath kernel_path_from_string(const std::string& name);
// The paths this CPU can execute, narrowest first.
std::vector<KernelPath> kernel_paths_available();
KernelPath kernel_path();
// Process-wide; std::invalid_argument when the CPU cannot run `p`. Not for use while another thread
// is inside a kernel.
void set_kernel_path(KernelPath p);

// x (..., K) times w (N, K) transposed, plus b (N) when defined, then GELU (exact erf form) when
// asked, then plus residual (..., N) when defined: (..., N). Decode does bias, GELU and residual in
// the product's epilogue (up to kMatvecBlockedMaxRows rows, in blocks of kMatvecMaxRows); Library is
// at::linear, at::gelu and an add.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Kernels k,
                   const at::Tensor& residual = {}, bool gelu = false);

// LayerNorm over the last dim with weight and bias (d): Decode computes up to kMatvecBlockedMaxRows
// rows itself, each row the same whatever the rows beside it (a prefill of up to 64 rows is then
// batch-invariant bit for bit, as the products are).
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, Kernels k);

// softmax(q K^T / sqrt(hd) + mask) V for q (B, H, T, hd) and K, V (B, H, S, hd); mask (T, S) or
// undefined. Decode takes the one-query, no-mask, CPU float32 case; the rest is LibTorch's.
// Returns (B, H, T, hd).
at::Tensor attend(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask, Kernels k);

// The kernels alone, for tests and the bench.
// x (R, K) float32 CPU, w (N, K) float32 CPU contiguous, b (N) or undefined -> (R, N). Any R.
at::Tensor matvec(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
// Decode's GELU of a float32 CPU tensor, elementwise -> the same shape.
at::Tensor decode_gelu(const at::Tensor& x);
// q (B, H, 1, hd), K and V (B, H, S, hd), float32 CPU with the last dim contiguous -> (B, H, 1, hd).
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V);

}  // namespace tinygpt
