#include "paged_kv_cache.h"

PagedKVCache::PagedKVCache(const tinygpt::Config& cfg) : context_(cfg.context), layers_(cfg.n_layers) {}

std::pair<at::Tensor, at::Tensor> PagedKVCache::update(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  Layer& L = layers_.at(layer);
  // Append the new positions, filling the last page before opening another.
  for (int64_t t = 0; t < k.size(2);) {
    if (L.k.empty() || L.k.back().size(2) == kPage) {
      L.k.push_back(k.narrow(2, t, 0));
      L.v.push_back(v.narrow(2, t, 0));
    }
    const int64_t take = std::min(kPage - L.k.back().size(2), k.size(2) - t);
    L.k.back() = at::cat({L.k.back(), k.narrow(2, t, take)}, 2);
    L.v.back() = at::cat({L.v.back(), v.narrow(2, t, take)}, 2);
    L.stored += take;
    t += take;
  }
  // What this step attends to: every kept position, the new ones included.
  std::vector<at::Tensor> ks(L.k.begin(), L.k.end()), vs(L.v.begin(), L.v.end());
  at::Tensor K = at::cat(ks, 2).narrow(2, L.skip, L.stored), V = at::cat(vs, 2).narrow(2, L.skip, L.stored);
#ifndef PLANTED_BUG
  // Then keep the last `context` positions: evict whole pages, remember the offset into the first.
  while (L.stored > context_) {
    const int64_t drop = std::min(L.stored - context_, L.k.front().size(2) - L.skip);
    L.skip += drop;
    L.stored -= drop;
    if (L.skip == L.k.front().size(2)) {
      L.k.pop_front();
      L.v.pop_front();
      L.skip = 0;
    }
  }
#endif
  return {K, V};
}

void PagedKVCache::reset() {
  for (auto& L : layers_) L = Layer{};
}

int64_t PagedKVCache::length() const { return layers_[0].stored; }

int64_t PagedKVCache::bytes() const {
  int64_t n = 0;
  for (const auto& L : layers_)
    if (!L.k.empty()) n += 2 * L.stored * (L.k.front().numel() / std::max<int64_t>(1, L.k.front().size(2))) * 4;
  return n;
}
