#include "tinygpt/kv_cache.h"

#include <ATen/ATen.h>
#include <stdexcept>
#include <string>

#include "tinygpt/config.h"

namespace tinygpt {

RollingKVCache::RollingKVCache(int64_t n_layers, int64_t context)
    : context_(context), k_(static_cast<size_t>(n_layers)), v_(static_cast<size_t>(n_layers)) {
  if (n_layers < 1) throw std::invalid_argument("RollingKVCache: n_layers must be >= 1");
  if (context < 1) throw std::invalid_argument("RollingKVCache: context must be >= 1");
}

RollingKVCache::RollingKVCache(const Config& cfg) : RollingKVCache(cfg.n_layers, cfg.context) {}

std::pair<at::Tensor, at::Tensor> RollingKVCache::update(int64_t layer, const at::Tensor& k,
                                                         const at::Tensor& v) {
  if (layer < 0 || layer >= static_cast<int64_t>(k_.size()))
    throw std::out_of_range("RollingKVCache: layer " + std::to_string(layer) + " out of range");
  auto& ck = k_[layer];
  auto& cv = v_[layer];
  // (B, H, S_old + T, hd): the queries see every stored key plus the new ones.
  at::Tensor K = ck.defined() ? at::cat({ck, k}, 2) : k;
  at::Tensor V = cv.defined() ? at::cat({cv, v}, 2) : v;
  const int64_t S = K.size(2);
  const int64_t keep = std::min(S, context_);
  // Trim AFTER attending: a decode step may see context+1 keys (SPEC 4).
  ck = K.narrow(2, S - keep, keep);
  cv = V.narrow(2, S - keep, keep);
  return {K, V};
}

void RollingKVCache::reset() {
  for (auto& t : k_) t = at::Tensor();
  for (auto& t : v_) t = at::Tensor();
}

int64_t RollingKVCache::length() const { return k_[0].defined() ? k_[0].size(2) : 0; }

int64_t RollingKVCache::bytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < k_.size(); ++i) {
    if (k_[i].defined()) n += k_[i].numel() * k_[i].element_size();
    if (v_[i].defined()) n += v_[i].numel() * v_[i].element_size();
  }
  return n;
}

}  // namespace tinygpt
