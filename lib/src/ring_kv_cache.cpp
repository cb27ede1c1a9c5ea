#include "tinygpt/ring_kv_cache.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "tinygpt/config.h"

namespace tinygpt {

RingKVCache::RingKVCache(const Config& cfg)
    : context_(cfg.context), k_(cfg.n_layers), v_(cfg.n_layers), fed_(cfg.n_layers, 0) {
  cfg.require_seed_architecture("the ring cache (CUDA graph)");
}

std::pair<at::Tensor, at::Tensor> RingKVCache::update(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (layer < 0 || layer >= layers()) throw std::out_of_range("RingKVCache: layer " + std::to_string(layer) + " out of range");
  if (k.dim() != 4 || !k.sizes().equals(v.sizes())) throw std::invalid_argument("RingKVCache: k and v must both be (B, H, T, hd)");
  const int64_t T = k.size(2), slots = context_ + 1;
  at::Tensor& K = k_[layer];
  at::Tensor& V = v_[layer];
  int64_t& fed = fed_[layer];
  if (fed == 0) {  // a prefill: slots 0 .. T-1, in order
    if (T > context_) throw std::invalid_argument("RingKVCache: a prefill of " + std::to_string(T) + " tokens exceeds the context");
    const bool fits = K.defined() && K.size(0) == k.size(0) && K.size(1) == k.size(1) && K.size(3) == k.size(3) &&
                      K.scalar_type() == k.scalar_type() && K.device() == k.device();
    if (!fits) {
      K = at::zeros({k.size(0), k.size(1), slots, k.size(3)}, k.options());  // (B, H, context + 1, hd)
      V = at::zeros_like(K);
    }
    K.narrow(2, 0, T).copy_(k);
    V.narrow(2, 0, T).copy_(v);
    fed = T;
    return {K.narrow(2, 0, T), V.narrow(2, 0, T)};
  }
  if (T != 1) throw std::invalid_argument("RingKVCache: after the prefill, one token at a time");
  const int64_t slot = fed % slots;
  K.narrow(2, slot, 1).copy_(k);
  V.narrow(2, slot, 1).copy_(v);
  ++fed;
  // Before the ring wraps its filled slots are 0 .. fed-1; after, all context + 1 (the rolling
  // cache's context stored plus the new one).
  const int64_t filled = std::min(fed, slots);
  return {K.narrow(2, 0, filled), V.narrow(2, 0, filled)};
}

void RingKVCache::reset() {
  for (auto& f : fed_) f = 0;  // the rings stay allocated for the next sequence
}

void RingKVCache::advance() {
  for (auto& f : fed_) ++f;
}

int64_t RingKVCache::length() const { return std::min(fed_[0], context_); }

int64_t RingKVCache::bytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < k_.size(); ++l)
    if (k_[l].defined()) n += 2 * std::min(fed_[l], context_) * (k_[l].numel() / k_[l].size(2)) * k_[l].element_size();
  return n;
}

int64_t RingKVCache::capacity_bytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < k_.size(); ++l)
    if (k_[l].defined()) n += (k_[l].numel() + v_[l].numel()) * k_[l].element_size();
  return n;
}

}  // namespace tinygpt
