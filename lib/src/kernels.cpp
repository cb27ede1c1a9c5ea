// The kernels behind Kernels::Decode (see kernels.h for why they exist): which code path runs
// (kernels_paths.h: portable or AVX2, a file each), the work split over threads, the products'
// epilogues, and the tensor entry points.
// matvec: y[r][n] = b[n] + sum_k x[r][k] w[n][k].
// Rows of w are split over LibTorch's intra-op threads; inside a thread, four weight rows at a
// time meet two input rows at a time, so each weight row is read from memory once and from L1
// for the other input rows. Sums run in eight lanes and are added at the end: a different order
// from BLAS, so results differ from at::linear by float rounding (~1e-6 on the model's logits),
// which the equivalence checks measure against the full forward.
#include "tinygpt/kernels.h"

#include "kernels_paths.h"
#include "kernels_raw.h"
#include "tinygpt/attention_policy.h"

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

namespace tinygpt {

namespace {

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

}  // namespace

namespace raw {

void gelu(float* y, int64_t n) {
#ifdef TINYGPT_HAVE_AVX2_PATH
  if (avx2_in_force()) {
    paths::gelu_row_avx2(y, n);
    return;
  }
#endif
  paths::gelu_row_portable(y, n);
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
    if (avx2) paths::rows_avx2(wp, xp, yp, n0, n1, K, R, N);
    else
#endif
      paths::rows_generic(wp, xp, yp, n0, n1, K, R, N);
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
  return rows >= 1 && rows <= kMatvecBlockedMaxRows && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
         w.scalar_type() == at::kFloat && w.is_contiguous() && (!b.defined() || b.is_contiguous());
}
}  // namespace

at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Kernels k, const at::Tensor& residual,
                   bool apply_gelu) {
  if (k == Kernels::Decode && decodable(x, w, b) && (!residual.defined() || residual.scalar_type() == at::kFloat)) {
    const int64_t K = x.size(-1), rows = x.numel() / K, N = w.size(0);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = N;
    const at::Tensor xr = x.reshape({rows, K});
    const at::Tensor res = residual.defined() ? residual.reshape({rows, N}) : residual;
    if (rows <= kMatvecMaxRows) return matvec(xr, w, b, res, apply_gelu).view(shape);  // (..., N)
    std::vector<at::Tensor> blocks;  // each (<= kMatvecMaxRows, N): the weight streamed once a block
    for (int64_t r0 = 0; r0 < rows; r0 += kMatvecMaxRows) {
      const int64_t n = std::min(kMatvecMaxRows, rows - r0);
      blocks.push_back(matvec(xr.narrow(0, r0, n), w, b, res.defined() ? res.narrow(0, r0, n) : res, apply_gelu));
    }
    return at::cat(blocks, 0).view(shape);  // (..., N)
  }
  at::Tensor y = at::linear(x, w, b);
  if (apply_gelu) y = at::gelu(y);  // exact erf form
  return residual.defined() ? residual + y : y;
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, Kernels k) {
  const int64_t d = x.size(-1), rows = d > 0 ? x.numel() / d : 0;
  if (k == Kernels::Decode && rows >= 1 && rows <= kMatvecBlockedMaxRows && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
      w.scalar_type() == at::kFloat && b.defined() && b.scalar_type() == at::kFloat && w.is_contiguous() && b.is_contiguous())
    return layer_norm_rows(x, w, b, eps);
  return at::layer_norm(x, {d}, w, b, eps);
}


namespace raw {

void attention_row(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, float* y, int64_t S, int64_t hd,
                   float* p) {
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(hd)));
#ifdef TINYGPT_HAVE_AVX2_PATH
  if (avx2_in_force() && hd % 8 == 0 && hd / 8 <= paths::kAttentionMaxVectors) {
    paths::attention_row_avx2(q, k, ks, v, vs, y, S, hd, scale, p);
    return;
  }
#endif
  paths::attention_row_generic(q, k, ks, v, vs, y, S, hd, scale, p);
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
  return attention_reference(q, K, V, mask);  // (B, H, T, hd)
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
  if (paths::cpu_has_avx2_fma()) out.push_back(KernelPath::Avx2);
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
