#include "tinygpt/int8_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "tinygpt/config.h"

namespace tinygpt {

Int8KVCache::Int8KVCache(int64_t n_layers, int64_t context)
    : context_(context),
      kq_(static_cast<size_t>(std::max<int64_t>(n_layers, 0))),
      vq_(kq_.size()),
      ks_(kq_.size()),
      vs_(kq_.size()) {
  if (n_layers < 1) throw std::invalid_argument("Int8KVCache: n_layers must be >= 1");
  if (context < 1) throw std::invalid_argument("Int8KVCache: context must be >= 1");
}

Int8KVCache::Int8KVCache(const Config& cfg) : Int8KVCache(cfg.n_layers, cfg.context) {
  cfg.require_seed_architecture("the int8 cache");
}

at::Tensor Int8KVCache::absmax_scale(const at::Tensor& x) {
  const at::Tensor m = x.abs().amax(-1, /*keepdim=*/true);  // (B, H, T, 1)
  return at::where(m > 0, m / 127.0, at::ones_like(m));
}

Int8KVCache::Quantized Int8KVCache::quantize_with(const at::Tensor& x, const at::Tensor& scale, bool trunc) {
  at::Tensor r = x / scale;
  r = trunc ? r.trunc() : r.round();  // round: half to even, as torch.round
  return {r.clamp(-127, 127).to(at::kChar), scale};
}

Int8KVCache::Quantized Int8KVCache::quantize(const at::Tensor& x) { return quantize_with(x, absmax_scale(x)); }

Int8KVCache::Quantized Int8KVCache::quantize_k(int64_t, const at::Tensor& k, const at::Tensor&) const { return quantize(k); }
Int8KVCache::Quantized Int8KVCache::quantize_v(int64_t, const at::Tensor&, const at::Tensor& v) const { return quantize(v); }

std::unique_ptr<Int8KVCache> Int8KVCache::make_empty() const {
  return std::make_unique<Int8KVCache>(static_cast<int64_t>(kq_.size()), context_);
}

namespace {
at::Tensor dequantize(const at::Tensor& q, const at::Tensor& scale) { return q.to(scale.scalar_type()) * scale; }
}  // namespace

std::pair<at::Tensor, at::Tensor> Int8KVCache::update(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (layer < 0 || layer >= static_cast<int64_t>(kq_.size()))
    throw std::out_of_range("Int8KVCache: layer " + std::to_string(layer) + " out of range");
  if (k.scalar_type() != at::kFloat || v.scalar_type() != at::kFloat)
    throw std::invalid_argument("Int8KVCache: keys and values must be float32");
  const auto l = static_cast<size_t>(layer);
  const Quantized qk = quantize_k(layer, k, v), qv = quantize_v(layer, k, v);
  const int64_t S_old = kq_[l].defined() ? kq_[l].size(2) : 0, T = k.size(2);
  auto join = [&](const at::Tensor& old, const at::Tensor& add) { return S_old ? at::cat({old, add}, 2) : add; };
  const at::Tensor KQ = join(kq_[l], qk.q), VQ = join(vq_[l], qv.q);          // (B, H, S, hd) int8
  const at::Tensor KS = join(ks_[l], qk.scale), VS = join(vs_[l], qv.scale);  // (B, H, S, 1)
  const int64_t S = S_old + T, seen = std::min(S_old, context_) + T;
  const int64_t keep = std::min(S, context_ + kRollbackEntries);  // trimmed after attending (SPEC 4)
  kq_[l] = KQ.narrow(2, S - keep, keep), vq_[l] = VQ.narrow(2, S - keep, keep);
  ks_[l] = KS.narrow(2, S - keep, keep), vs_[l] = VS.narrow(2, S - keep, keep);
  return {dequantize(KQ.narrow(2, S - seen, seen), KS.narrow(2, S - seen, seen)),
          dequantize(VQ.narrow(2, S - seen, seen), VS.narrow(2, S - seen, seen))};
}

std::pair<at::Tensor, at::Tensor> Int8KVCache::stored(int64_t layer) const {
  const auto l = static_cast<size_t>(layer);
  if (layer < 0 || l >= kq_.size()) throw std::out_of_range("Int8KVCache: layer " + std::to_string(layer) + " out of range");
  if (!kq_[l].defined()) return {};
  return {dequantize(kq_[l], ks_[l]), dequantize(vq_[l], vs_[l])};
}

std::unique_ptr<KVCache> Int8KVCache::clone() const {
  auto c = make_empty();
  for (size_t l = 0; l < kq_.size(); ++l)
    if (kq_[l].defined()) c->kq_[l] = kq_[l].clone(), c->vq_[l] = vq_[l].clone(), c->ks_[l] = ks_[l].clone(), c->vs_[l] = vs_[l].clone();
  return c;
}

void Int8KVCache::truncate(int64_t n) {
  const int64_t S = kq_[0].defined() ? kq_[0].size(2) : 0;
  if (n < 0 || n > S) throw std::invalid_argument("Int8KVCache: cannot drop " + std::to_string(n) + " of " + std::to_string(S) + " entries");
  for (size_t l = 0; l < kq_.size(); ++l) {
    if (!kq_[l].defined()) continue;
    if (S - n == 0) {
      kq_[l] = vq_[l] = ks_[l] = vs_[l] = at::Tensor();
      continue;
    }
    kq_[l] = kq_[l].narrow(2, 0, S - n), vq_[l] = vq_[l].narrow(2, 0, S - n);
    ks_[l] = ks_[l].narrow(2, 0, S - n), vs_[l] = vs_[l].narrow(2, 0, S - n);
  }
}

void Int8KVCache::reset() {
  for (auto* v : {&kq_, &vq_, &ks_, &vs_})
    for (auto& t : *v) t = at::Tensor();
}

int64_t Int8KVCache::length() const { return kq_[0].defined() ? std::min(kq_[0].size(2), context_) : 0; }

int64_t Int8KVCache::bytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < kq_.size(); ++l) {
    if (!kq_[l].defined()) continue;
    const int64_t S = kq_[l].size(2), w = std::min(S, context_);
    n += 2 * w * (kq_[l].numel() / S) * kq_[l].element_size() + 2 * w * (ks_[l].numel() / S) * ks_[l].element_size();
  }
  return n;
}

int64_t Int8KVCache::capacity_bytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < kq_.size(); ++l)
    if (kq_[l].defined())
      n += (kq_[l].numel() + vq_[l].numel()) * kq_[l].element_size() + (ks_[l].numel() + vs_[l].numel()) * ks_[l].element_size();
  return n;
}

}  // namespace tinygpt
