#include "tinygpt/kv_cache.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <stdexcept>
#include <string>

#include "tinygpt/config.h"

namespace tinygpt {

namespace {
std::vector<int64_t> same_windows(int64_t n_layers, int64_t context) {
  if (n_layers < 1) throw std::invalid_argument("RollingKVCache: n_layers must be >= 1");
  if (context < 1) throw std::invalid_argument("RollingKVCache: context must be >= 1");
  return std::vector<int64_t>(static_cast<size_t>(n_layers), context);
}
std::vector<int64_t> config_windows(const Config& cfg) {
  std::vector<int64_t> w;
  for (int64_t l = 0; l < cfg.n_layers; ++l) w.push_back(cfg.cache_window(l));
  return w;
}
}  // namespace

RollingKVCache::RollingKVCache(std::vector<int64_t> windows)
    : context_(*std::max_element(windows.begin(), windows.end())), windows_(std::move(windows)),
      k_(windows_.size()), v_(windows_.size()) {
  for (int64_t w : windows_)
    if (w < 0) throw std::invalid_argument("RollingKVCache: a window must be >= 0");
}

RollingKVCache::RollingKVCache(int64_t n_layers, int64_t context) : RollingKVCache(same_windows(n_layers, context)) {}

RollingKVCache::RollingKVCache(const Config& cfg) : RollingKVCache(config_windows(cfg)) {}

std::unique_ptr<KVCache> KVCache::clone() const { throw std::logic_error(row_ops_unsupported()); }
void KVCache::truncate(int64_t) { throw std::logic_error(row_ops_unsupported()); }
std::pair<at::Tensor, at::Tensor> KVCache::stored(int64_t) const { throw std::logic_error(save_unsupported()); }

int64_t KVCache::stored_length(int64_t layer) const {
  const auto kv = stored(layer);
  return kv.first.defined() ? kv.first.size(2) : 0;
}

int64_t RollingKVCache::stored_length(int64_t layer) const {
  const auto l = static_cast<size_t>(layer);
  if (layer < 0 || l >= k_.size()) throw std::out_of_range("RollingKVCache: layer " + std::to_string(layer) + " out of range");
  return k_[l].defined() ? k_[l].size(2) : 0;
}

std::pair<at::Tensor, at::Tensor> RollingKVCache::stored(int64_t layer) const {
  const auto l = static_cast<size_t>(layer);
  if (layer < 0 || l >= k_.size()) throw std::out_of_range("RollingKVCache: layer " + std::to_string(layer) + " out of range");
  if (!k_[l].defined()) return {};
  return {k_[l].clone(), v_[l].clone()};
}

std::pair<at::Tensor, at::Tensor> RollingKVCache::update(int64_t layer, const at::Tensor& k,
                                                         const at::Tensor& v) {
  if (layer < 0 || layer >= static_cast<int64_t>(k_.size()))
    throw std::out_of_range("RollingKVCache: layer " + std::to_string(layer) + " out of range");
  auto& ck = k_[layer];
  auto& cv = v_[layer];
  const int64_t window = windows_[static_cast<size_t>(layer)];
  // The queries see the window (the newest `window` stored) plus the new keys: context + 1 for a
  // decode step (SPEC 4), w on a sliding layer (SPEC 10); older stored entries wait for a rollback.
  const int64_t S_old = ck.defined() ? ck.size(2) : 0, T = k.size(2);
  at::Tensor K = S_old ? at::cat({ck, k}, 2) : k;  // (B, G, S_old + T, hd)
  at::Tensor V = S_old ? at::cat({cv, v}, 2) : v;
  const int64_t S = S_old + T, seen = std::min(S_old, window) + T;
  // Trim AFTER attending (SPEC 4), keeping kRollbackEntries beyond the window.
  const int64_t keep = std::min(S, window + kRollbackEntries);
  ck = K.narrow(2, S - keep, keep);
  cv = V.narrow(2, S - keep, keep);
  return {K.narrow(2, S - seen, seen), V.narrow(2, S - seen, seen)};
}

std::unique_ptr<KVCache> RollingKVCache::clone() const {
  auto c = std::unique_ptr<RollingKVCache>(new RollingKVCache(windows_));
  for (size_t l = 0; l < k_.size(); ++l)
    if (k_[l].defined()) c->k_[l] = k_[l].clone(), c->v_[l] = v_[l].clone();
  return c;
}

void RollingKVCache::truncate(int64_t n) {
  // Every layer must hold the n entries it drops: a sliding layer keeps fewer than a full one, and a
  // rollback past what it kept could not restore its window.
  int64_t S = -1;  // the fewest any layer holds (layers never fed hold nothing and drop nothing)
  for (const auto& t : k_)
    if (t.defined()) S = S < 0 ? t.size(2) : std::min(S, t.size(2));
  S = std::max<int64_t>(S, 0);
  if (n < 0 || n > S) throw std::invalid_argument("RollingKVCache: cannot drop " + std::to_string(n) + " of " + std::to_string(S) + " entries");
  for (size_t l = 0; l < k_.size(); ++l) {
    if (!k_[l].defined()) continue;
    const int64_t left = k_[l].size(2) - n;
    if (left == 0) {
      k_[l] = at::Tensor(), v_[l] = at::Tensor();
      continue;
    }
    k_[l] = k_[l].narrow(2, 0, left);
    v_[l] = v_[l].narrow(2, 0, left);
  }
}

void RollingKVCache::reset() {
  for (auto& t : k_) t = at::Tensor();
  for (auto& t : v_) t = at::Tensor();
}

int64_t RollingKVCache::length() const { return k_[0].defined() ? std::min(k_[0].size(2), windows_[0]) : 0; }

int64_t RollingKVCache::bytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < k_.size(); ++i)
    if (k_[i].defined()) n += 2 * std::min(k_[i].size(2), windows_[i]) * (k_[i].numel() / k_[i].size(2)) * k_[i].element_size();
  return n;
}

int64_t RollingKVCache::capacity_bytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < k_.size(); ++i)
    if (k_[i].defined()) n += (k_[i].numel() + v_[i].numel()) * k_[i].element_size();
  return n;
}

}  // namespace tinygpt
