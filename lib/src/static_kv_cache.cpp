#include "tinygpt/static_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>

#include <stdexcept>
#include <string>

#include "tinygpt/huge_pages.h"
#include "tinygpt/config.h"

namespace tinygpt {

StaticKVCache::StaticKVCache(int64_t n_layers, int64_t context) : context_(context) {
  if (n_layers < 1) throw std::invalid_argument("StaticKVCache: n_layers must be >= 1");
  if (context < 1) throw std::invalid_argument("StaticKVCache: context must be >= 1");
  layers_.resize(static_cast<size_t>(n_layers));
}

StaticKVCache::StaticKVCache(const Config& cfg) : StaticKVCache(cfg.n_layers, cfg.context) {
  cfg.require_seed_architecture("the static cache");  // one window, H heads: no sliding layer, no KV groups
}

int64_t StaticKVCache::reserve(int64_t layer, int64_t B, int64_t H, int64_t T, int64_t hd, const at::TensorOptions& opts) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size()))
    throw std::out_of_range("StaticKVCache: layer " + std::to_string(layer) + " out of range");
  Layer& L = layers_[layer];
  const bool fits = L.k.defined() && L.k.size(0) == B && L.k.size(1) == H && L.k.size(3) == hd &&
                    L.k.scalar_type() == opts.dtype().toScalarType() && L.k.device() == opts.device();
  if (!fits || L.len == 0) {
    // A new sequence, or a new shape: room for two windows and a step (the live entries move to
    // the front once every ~context steps), at least what is kept (the window and the rollback
    // history) and a step, or a longer prefill.
    const int64_t capacity = std::max({2 * context_ + 1, context_ + kRollbackEntries + 1, T});
    if (!fits || L.k.size(2) < capacity) {
      if (layer == 0 && opts.device().is_cpu() && opts.dtype() == at::kFloat) {
        // Layer 0 starts every sequence (the model updates the layers in order, and a new sequence
        // or shape starts them all empty): every layer's K and V in one block of huge pages
        // (huge_pages.h), this shape; the other layers find theirs in place.
        const int64_t n = B * H * capacity * hd, layers = static_cast<int64_t>(layers_.size());
        const at::Tensor block = huge_page_floats(2 * layers * n);
        for (int64_t l = 0; l < layers; ++l) {
          Layer& M = layers_[static_cast<size_t>(l)];
          M.k = block.narrow(0, 2 * l * n, n).view({B, H, capacity, hd});
          M.v = block.narrow(0, (2 * l + 1) * n, n).view({B, H, capacity, hd});
          M.begin = M.len = 0;
        }
      } else {
        L.k = at::empty({B, H, capacity, hd}, opts);
        L.v = at::empty({B, H, capacity, hd}, opts);
      }
    }
    L.begin = 0;
    L.len = 0;
  }
  const int64_t capacity = L.k.size(2);
  if (L.begin + L.len + T > capacity) {
    if (L.len + T > capacity) {  // a long append on a full cache: grow, keeping the live entries
      at::Tensor nk = at::empty({B, H, L.len + T, hd}, opts), nv = at::empty_like(nk);
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
  return L.begin + L.len;
}

std::pair<int64_t, int64_t> StaticKVCache::commit(int64_t layer, int64_t T) {
  Layer& L = layers_[layer];
  const int64_t S = L.len + T, n_seen = std::min(L.len, context_) + T;
  // The window (the newest `context` stored) plus the new entries: context + 1 keys for a decode step.
  const int64_t from = L.begin + S - n_seen;
  // Trim AFTER attending (SPEC 4), keeping kRollbackEntries beyond the window: bookkeeping only,
  // the entries stay where they are until the next append.
  const int64_t keep = std::min(S, context_ + kRollbackEntries);
  L.begin += S - keep;
  L.len = keep;
  return {from, n_seen};
}

std::pair<at::Tensor, at::Tensor> StaticKVCache::update(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (k.dim() != 4 || !k.sizes().equals(v.sizes()))
    throw std::invalid_argument("StaticKVCache: k and v must both be (B, H, T, hd)");
  const int64_t T = k.size(2);
  const int64_t slot = reserve(layer, k.size(0), k.size(1), T, k.size(3), k.options());
  Layer& L = layers_[layer];
  L.k.narrow(2, slot, T).copy_(k);
  L.v.narrow(2, slot, T).copy_(v);
  const auto [from, n_seen] = commit(layer, T);
  return {L.k.narrow(2, from, n_seen), L.v.narrow(2, from, n_seen)};  // (B, H, S', hd)
}

StaticKVCache::RawAppend StaticKVCache::append_one(int64_t layer, int64_t B, int64_t H, int64_t hd) {
  const int64_t slot = reserve(layer, B, H, 1, hd, at::TensorOptions().dtype(at::kFloat).device(at::kCPU));
  Layer& L = layers_[layer];
  const auto [from, n_seen] = commit(layer, 1);
  RawAppend a;
  a.k = L.k.data_ptr<float>();
  a.v = L.v.data_ptr<float>();
  a.plane = L.k.size(2) * hd;
  a.slot = slot;
  a.from = from;
  a.seen = n_seen;
  return a;
}

void StaticKVCache::reset() {
  // The buffers stay allocated for the next sequence; only the bookkeeping restarts.
  for (auto& L : layers_) L.begin = L.len = 0;
}

int64_t StaticKVCache::length() const { return std::min(layers_[0].len, context_); }

int64_t StaticKVCache::bytes() const {
  int64_t n = 0;
  for (const auto& L : layers_)
    if (L.k.defined()) n += 2 * std::min(L.len, context_) * (L.k.numel() / L.k.size(2)) * L.k.element_size();
  return n;
}

std::unique_ptr<KVCache> StaticKVCache::clone() const {
  auto c = std::make_unique<StaticKVCache>(static_cast<int64_t>(layers_.size()), context_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    Layer& M = c->layers_[l];
    M.begin = L.begin;
    M.len = L.len;
    if (!L.k.defined()) continue;
    // Buffers of the same shape for the fork to write, the live entries copied: no slot outside
    // [begin, begin + len) is ever read (commit() attends to live entries and the new ones), so a
    // clone costs the entries a sequence holds, not the buffer's 2 x context + 1 slots.
    M.k = at::empty_like(L.k);
    M.v = at::empty_like(L.v);
    if (L.len > 0) {
      M.k.narrow(2, L.begin, L.len).copy_(L.k.narrow(2, L.begin, L.len));
      M.v.narrow(2, L.begin, L.len).copy_(L.v.narrow(2, L.begin, L.len));
    }
  }
  return c;
}

std::pair<at::Tensor, at::Tensor> StaticKVCache::stored(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size()))
    throw std::out_of_range("StaticKVCache: layer " + std::to_string(layer) + " out of range");
  const Layer& L = layers_[static_cast<size_t>(layer)];
  if (!L.k.defined() || L.len == 0) return {};
  return {L.k.narrow(2, L.begin, L.len).clone(), L.v.narrow(2, L.begin, L.len).clone()};
}

void StaticKVCache::truncate(int64_t n) {
  if (n < 0 || n > layers_[0].len)
    throw std::invalid_argument("StaticKVCache: cannot drop " + std::to_string(n) + " of " + std::to_string(layers_[0].len) + " entries");
  for (auto& L : layers_) L.len -= n;  // the older entries stay where they are: the window slides back onto them
}

int64_t StaticKVCache::capacity_bytes() const {
  int64_t n = 0;
  for (const auto& L : layers_)
    if (L.k.defined()) n += (L.k.numel() + L.v.numel()) * L.k.element_size();
  return n;
}

}  // namespace tinygpt
