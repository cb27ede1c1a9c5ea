#include "tinygpt/fused_step.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>
#include <stdexcept>

#include "kernels_raw.h"
#include "tinygpt/attention_policy.h"
#include "tinygpt/gpt.h"
#include "tinygpt/kernel_step.h"
#include "tinygpt/rope.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt {

const char* FusedStepProfile::name(Part p) {
  switch (p) {
    case Embedding: return "embedding, RoPE angles, scratch";
    case Norms: return "layer norms (2 per layer + final)";
    case QkvProducts: return "QKV products";
    case OutProducts: return "attention output products";
    case UpProducts: return "MLP up products (+ bias, GELU)";
    case DownProducts: return "MLP down products (+ bias, residual)";
    case HeadProduct: return "head product (tied embedding)";
    case RopeAndCache: return "RoPE, K and V into the cache";
    case Attention: return "attention";
    default: return "?";
  }
}

namespace {
// Charges the time since the last lap to a part; does nothing without a profile.
class Laps {
 public:
  explicit Laps(FusedStepProfile* p) : p_(p) {
    if (p_) t_ = std::chrono::steady_clock::now();
  }
  void lap(FusedStepProfile::Part part) {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    p_->seconds[part] += std::chrono::duration<double>(now - t_).count();
    t_ = now;
  }

 private:
  FusedStepProfile* p_;
  std::chrono::steady_clock::time_point t_;
};
}  // namespace

at::Tensor FusedCpuStep::operator()(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, Kernels kernels) {
  if (&cache != static_cast<KVCache*>(&cache_)) throw std::logic_error("FusedCpuStep: called with a cache it is not bound to");
  const Config& cfg = model.config();
  if (!model.seed_architecture()) cfg.require_seed_architecture("the fused decode step");  // throws, naming the knob
  const at::Tensor& E = model.emb->weight;  // (V, d), also the tied head
  const int64_t B = idx.size(0), T = idx.size(1);
  if (kernels != Kernels::Decode || T != 1 || B < 1 || B > kMatvecMaxRows || !idx.device().is_cpu() ||
      !E.device().is_cpu() || E.scalar_type() != at::kFloat || !E.is_contiguous())
    return step_with(model, idx, cache, start, production_policy(), kernels);

  Laps laps(profile_);
  if (profile_) ++profile_->steps;
  const int64_t d = cfg.d_model, H = cfg.n_heads, hd = d / H, V = cfg.vocab_size, F = 4 * d;
  // Scratch: x and x2 (B, d) the residual stream before and after an add (a product's output may not
  // be its residual input), h (B, d) a norm's output, qkv (B, 3d), att (B, d) the heads' outputs side
  // by side, u (B, 4d) the MLP's hidden after its GELU, p (context + 1) a row's scores.
  scratch_.resize(static_cast<size_t>(B * (d + d + d + 3 * d + d + F) + cfg.context + 1));
  float* x = scratch_.data();
  float* x2 = x + B * d;
  float* h = x2 + B * d;
  float* qkv = h + B * d;
  float* att = qkv + B * 3 * d;
  float* u = att + B * d;
  float* p = u + B * F;

  const at::Tensor ids = idx.contiguous().to(at::kLong);  // (B, 1)
  const int64_t* id = ids.data_ptr<int64_t>();
  const float* ep = E.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) std::memcpy(x + b * d, ep + id[b] * d, static_cast<size_t>(d) * sizeof(float));

  const auto [cos_t, sin_t] = rope_angles(start, 1, hd, c10::Device(c10::kCPU));  // (1, hd/2) each
  const float* cs = cos_t.data_ptr<float>();
  const float* sn = sin_t.data_ptr<float>();
  auto ptr = [](const at::Tensor& t) { return t.data_ptr<float>(); };
  laps.lap(FusedStepProfile::Embedding);

  int64_t layer = 0;
  for (const auto& m : *model.blocks) {
    auto* blk = m->as<BlockImpl>();
    auto& a = *blk->attn;
    // h = norm1(x); qkv = h Wqkv^T  (B, 3d)
    raw::layer_norm(x, ptr(blk->norm1->weight), ptr(blk->norm1->bias), static_cast<float>(blk->norm1->eps()), h, B, d);
    laps.lap(FusedStepProfile::Norms);
    raw::matvec(h, ptr(a.qkv->weight), nullptr, nullptr, qkv, B, d, 3 * d);
    laps.lap(FusedStepProfile::QkvProducts);
    // RoPE on q in place and on k straight into the cache's new slot; v copied beside it.
    const StaticKVCache::RawAppend slot = cache_.append_one(layer++, B, H, hd);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t plane = (b * H + hh) * slot.plane + slot.slot * hd;
        float* q = qkv + b * 3 * d + hh * hd;
        raw::rope_row(q, cs, sn, q, hd);
        raw::rope_row(qkv + b * 3 * d + d + hh * hd, cs, sn, slot.k + plane, hd);
        std::memcpy(slot.v + plane, qkv + b * 3 * d + 2 * d + hh * hd, static_cast<size_t>(hd) * sizeof(float));
      }
    laps.lap(FusedStepProfile::RopeAndCache);
    // Each (row, head): its query against the window and the new key (SPEC 4: context + 1 keys).
    if (B * H > 1 && at::get_num_threads() > 1) {
      at::parallel_for(0, B * H, 1, [&](int64_t r0, int64_t r1) {
        std::vector<float> scores(static_cast<size_t>(slot.seen));
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t b = r / H, hh = r % H, off = r * slot.plane + slot.from * hd;
          raw::attention_row(qkv + b * 3 * d + hh * hd, slot.k + off, hd, slot.v + off, hd, att + b * d + hh * hd, slot.seen, hd,
                             scores.data());
        }
      });
    } else {
      for (int64_t r = 0; r < B * H; ++r) {
        const int64_t b = r / H, hh = r % H, off = r * slot.plane + slot.from * hd;
        raw::attention_row(qkv + b * 3 * d + hh * hd, slot.k + off, hd, slot.v + off, hd, att + b * d + hh * hd, slot.seen, hd, p);
      }
    }
    laps.lap(FusedStepProfile::Attention);
    // x = x + att Wout^T
    raw::matvec(att, ptr(a.out->weight), nullptr, x, x2, B, d, d);
    std::swap(x, x2);
    laps.lap(FusedStepProfile::OutProducts);
    // x = x + GELU(norm2(x) Wup^T + bup) Wdown^T + bdown
    raw::layer_norm(x, ptr(blk->norm2->weight), ptr(blk->norm2->bias), static_cast<float>(blk->norm2->eps()), h, B, d);
    laps.lap(FusedStepProfile::Norms);
    raw::matvec(h, ptr(blk->up->weight), ptr(blk->up->bias), nullptr, u, B, d, F, /*apply_gelu=*/true);  // (B, 4d)
    laps.lap(FusedStepProfile::UpProducts);
    raw::matvec(u, ptr(blk->down->weight), ptr(blk->down->bias), x, x2, B, F, d);
    std::swap(x, x2);
    laps.lap(FusedStepProfile::DownProducts);
  }
  // logits = norm(x) E^T  (B, V)
  raw::layer_norm(x, ptr(model.norm->weight), ptr(model.norm->bias), static_cast<float>(model.norm->eps()), h, B, d);
  laps.lap(FusedStepProfile::Norms);
  at::Tensor logits = at::empty({B, V}, E.options());
  raw::matvec(h, ep, nullptr, nullptr, logits.data_ptr<float>(), B, d, V);
  laps.lap(FusedStepProfile::HeadProduct);
  return logits;
}

}  // namespace tinygpt
