// The KV cache behind a small interface (SPEC 4): the model hands each layer's new keys and
// values to the cache and gets back what its queries attend to. The model never touches the
// storage, so a preallocated cache or a fault-injected one swaps in without model changes.
#pragma once

#include <ATen/core/Tensor.h>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tinygpt {

struct Config;

class KVCache {
 public:
  virtual ~KVCache() = default;

  // k, v: (B, H, T, hd) for the T tokens being fed now, already positioned.
  // Returns (K, V), each (B, H, S, hd): the keys and values these T queries attend to.
  // Also stores whatever the implementation keeps for the next step.
  virtual std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k,
                                                   const at::Tensor& v) = 0;
  // Forget everything: the next update starts a new sequence.
  virtual void reset() = 0;
  // Positions currently stored (layer 0), 0 after reset.
  virtual int64_t length() const = 0;
  // Bytes of all stored K and V tensors, every layer: the entries the next step attends to.
  virtual int64_t bytes() const = 0;
  // Bytes the cache holds allocated for K and V, every layer (>= bytes()). The series' cache
  // allocates exactly what it stores; a preallocated one holds room for more.
  virtual int64_t capacity_bytes() const { return bytes(); }

  // Which of the keys the last update of `layer` returned each row may see: (B, S) bool, or undefined
  // when all of them. A batch of rows of different lengths (serving.h) marks each row's padding.
  virtual at::Tensor key_mask(int64_t layer) const { return at::Tensor(); }
  // A cache standing for several rows may give each row's keys and values unpadded instead: then its
  // update() returns undefined tensors and this gives, per row, (1, H, S_r, hd) of the last update of
  // `layer`, each row's queries attending to its own alone (serving.h, for one-token steps of rows of
  // different lengths: no padded copy, no mask, and the one-query kernel per row). Empty otherwise.
  virtual std::vector<std::pair<at::Tensor, at::Tensor>> rows_seen(int64_t layer) const { return {}; }

  // --- Serving operations on one sequence (serving.h holds one cache per row) ---
  // Empty when fork and rollback work; else why not, for the checks to skip with.
  virtual std::string row_ops_unsupported() const { return "this cache does not implement clone and truncate"; }
  // An independent copy of everything stored: a fork. Writes to either never reach the other.
  virtual std::unique_ptr<KVCache> clone() const;
  // Drops the newest n entries (a rejected speculative draft). SPEC 4's window is over the sequence
  // that remains, so entries those n had pushed out of the window come back: a cache keeps
  // kRollbackEntries beyond the window for that, and refuses a longer rollback.
  virtual void truncate(int64_t n);

  // --- A row's state as a value (serving.h: save and restore) ---
  // Empty when stored() works; else why not.
  virtual std::string save_unsupported() const { return "this cache does not give its stored entries (KVCache::stored)"; }
  // Copies of the entries `layer` keeps, oldest first: K and V (B, H, S, hd), the window and any kept
  // for a rollback; undefined when empty. A new cache given them in one update() per layer continues
  // exactly as this one would.
  virtual std::pair<at::Tensor, at::Tensor> stored(int64_t layer) const;
  // How many entries `layer` keeps (what stored(layer) would give), without copying them.
  virtual int64_t stored_length(int64_t layer) const;
};

// Entries a rolling or static cache keeps beyond the window, so a rollback of up to this many tokens
// past the window restores exactly the window the remaining sequence had.
constexpr int64_t kRollbackEntries = 64;

// The series' cache: per layer, append the new k, v; attend to everything stored plus the
// new entries (up to context+1 keys for a decode step); then keep only the last `context`. A zoo
// member's sliding layer (SPEC 10) keeps its own window instead: the last w - 1, so a decode query
// sees w keys with its own; each layer's rollback history is its own. Entries have as many heads as
// the model's KV heads.
class RollingKVCache final : public KVCache {
 public:
  RollingKVCache(int64_t n_layers, int64_t context);
  // Layer l keeps cfg.cache_window(l) entries before a step.
  explicit RollingKVCache(const Config& cfg);
  // Layer l keeps windows[l] entries before a step (a harness models a cache that keeps other windows).
  explicit RollingKVCache(std::vector<int64_t> windows);

  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k,
                                           const at::Tensor& v) override;
  void reset() override;
  int64_t length() const override;
  int64_t bytes() const override;
  int64_t capacity_bytes() const override;
  std::string row_ops_unsupported() const override { return ""; }
  std::unique_ptr<KVCache> clone() const override;
  void truncate(int64_t n) override;
  std::string save_unsupported() const override { return ""; }
  std::pair<at::Tensor, at::Tensor> stored(int64_t layer) const override;
  int64_t stored_length(int64_t layer) const override;

 private:
  int64_t context_;               // the longest window (length() reports against it)
  std::vector<int64_t> windows_;  // per layer: the entries kept before a step
  // per layer: (B, G, <= window + kRollbackEntries, hd), undefined when empty; the newest `window`
  // entries are the window, the older ones wait for a rollback.
  std::vector<at::Tensor> k_, v_;
};

}  // namespace tinygpt
