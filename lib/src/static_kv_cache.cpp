#include "tinygpt/static_kv_cache.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "tinygpt/config.h"

namespace tinygpt {

StaticKVCache::StaticKVCache(int64_t n_layers, int64_t context) : context_(context) {
  if (n_layers < 1) throw std::invalid_argument("StaticKVCache: n_layers must be >= 1");
  if (context < 1) throw std::invalid_argument("StaticKVCache: context must be >= 1");
  layers_.resize(static_cast<size_t>(n_layers));
}

StaticKVCache::StaticKVCache(const Config& cfg) : StaticKVCache(cfg.n_layers, cfg.context) {}

std::pair<at::Tensor, at::Tensor> StaticKVCache::update(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size()))
    throw std::out_of_range("StaticKVCache: layer " + std::to_string(layer) + " out of range");
  if (k.dim() != 4 || !k.sizes().equals(v.sizes()))
    throw std::invalid_argument("StaticKVCache: k and v must both be (B, H, T, hd)");
  Layer& L = layers_[layer];
  const int64_t B = k.size(0), H = k.size(1), T = k.size(2), hd = k.size(3);
  const bool fits = L.k.defined() && L.k.size(0) == B && L.k.size(1) == H && L.k.size(3) == hd &&
                    L.k.scalar_type() == k.scalar_type() && L.k.device() == k.device();
  if (!fits || L.len == 0) {
    // A new sequence, or a new shape: room for context stored + context + 1 new, or a longer prefill.
    const int64_t capacity = std::max(2 * context_ + 1, T);
    if (!fits || L.k.size(2) < capacity) {
      L.k = at::empty({B, H, capacity, hd}, k.options());
      L.v = at::empty({B, H, capacity, hd}, v.options());
    }
    L.begin = 0;
    L.len = 0;
  }
  const int64_t capacity = L.k.size(2);
  if (L.begin + L.len + T > capacity) {
    if (L.len + T > capacity) {  // a long append on a full cache: grow, keeping the live entries
      at::Tensor nk = at::empty({B, H, L.len + T, hd}, k.options()), nv = at::empty_like(nk);
      nk.narrow(2, 0, L.len).copy_(L.k.narrow(2, L.begin, L.len));
      nv.narrow(2, 0, L.len).copy_(L.v.narrow(2, L.begin, L.len));
      L.k = nk;
      L.v = nv;
    } else if (L.len > 0) {
      // Move the live entries to the front. The ranges overlap when begin < len: copy via a clone.
      at::Tensor sk = L.k.narrow(2, L.begin, L.len), sv = L.v.narrow(2, L.begin, L.len);
      if (L.begin < L.len) sk = sk.clone(), sv = sv.clone();
      L.k.narrow(2, 0, L.len).copy_(sk);
      L.v.narrow(2, 0, L.len).copy_(sv);
    }
    L.begin = 0;
  }
  L.k.narrow(2, L.begin + L.len, T).copy_(k);
  L.v.narrow(2, L.begin + L.len, T).copy_(v);
  const int64_t S = L.len + T;
  std::pair<at::Tensor, at::Tensor> seen{L.k.narrow(2, L.begin, S), L.v.narrow(2, L.begin, S)};  // (B, H, S, hd)
  // Trim AFTER attending: a decode step sees context+1 keys, the cache keeps context (SPEC 4).
  const int64_t keep = std::min(S, context_);
  L.begin += S - keep;
  L.len = keep;
  return seen;
}

void StaticKVCache::reset() {
  // The buffers stay allocated for the next sequence; only the bookkeeping restarts.
  for (auto& L : layers_) L.begin = L.len = 0;
}

int64_t StaticKVCache::length() const { return layers_[0].len; }

int64_t StaticKVCache::bytes() const {
  int64_t n = 0;
  for (const auto& L : layers_)
    if (L.k.defined()) n += 2 * L.len * (L.k.numel() / L.k.size(2)) * L.k.element_size();
  return n;
}

int64_t StaticKVCache::capacity_bytes() const {
  int64_t n = 0;
  for (const auto& L : layers_)
    if (L.k.defined()) n += (L.k.numel() + L.v.numel()) * L.k.element_size();
  return n;
}

}  // namespace tinygpt
