// The fault table's private parts: what each seam's file (checks/src/faults/<seam>.cpp) builds its
// entries with. A fault is one entry - its class (the bug, behind one seam), then `r.add(...)` with its
// name, the bug in one line, the rows that must catch it, the feature it needs (a zoo fault's
// `applies`) and the engine adapters' faults that plant the same bug (its twins) - in the file of its
// seam. tinygpt/checks/faults.h is the table as the rest of the harness reads it.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_names.h"

namespace tinygpt::checks::faults {

// The entries of one seam's file, added to the registry in order.
class FaultFile {
 public:
  FaultFile(CacheRegistry& registry, std::string seam) : registry_(registry), seam_(std::move(seam)) {}
  // Adds `v`, a fault of this file's seam. `twins`: the engine adapters' planted faults that are the same
  // bug, "adapter:name" (engines/<adapter>/faults.txt), which a diagnosis of that engine must name `v` for.
  void add(CacheVariant v, std::vector<std::string> twins = {});

 private:
  CacheRegistry& registry_;
  std::string seam_;
};

// The rows that must catch a fault of the seed's architecture on any model: the logit-level ones that see
// its effect inside the window, or past it. Token checks are left out: on untrained weights greedy
// decoding repeats one token and misses most.
inline const std::vector<std::string> in_window = {check::kLogits, check::kWindowReference, check::kTeacherForced};
inline const std::vector<std::string> past_window = {check::kWindowReference, check::kTeacherForced};

// A fault is the `static` production path - the preallocated cache, the decode kernels and the fused
// step - with one decision changed; the caller changes it. Loop and serving-loop faults keep all of it.
CacheVariant fault(std::string name, std::string description, std::vector<std::string> expected);

// Serving faults run the rows that drive a serving operation (the default rows never drive rows
// apart), but the long ones (Tag::Long: far past the window, many operations) only where the fault is
// theirs: together they would triple the fault matrix's time.
std::vector<std::string> serving_rows_for(const std::string& expected);

// A policy fault runs the model's own step with the same kernels: the fused step computes the
// production positions and mask inside its kernels, so the changed policy must be the one the step reads.
template <typename Policy>
CacheVariant policy_fault(std::string name, std::string description, std::vector<std::string> expected) {
  CacheVariant v = fault(std::move(name), std::move(description), std::move(expected));
  v.make_step = nullptr;
  v.policy = std::make_shared<Policy>();
  return v;
}

// A cache fault brings its own storage, so it runs the model's own step: the fused step writes into
// a StaticKVCache's buffers directly and would bypass the fault.
template <typename Cache>
CacheVariant cache_fault(std::string name, std::string description, std::vector<std::string> expected) {
  CacheVariant v = fault(std::move(name), std::move(description), std::move(expected));
  v.make_step = nullptr;
  v.make_cache = [](const Config& c) { return std::make_unique<Cache>(c); };
  return v;
}

template <typename Cache>
CacheVariant serving_cache_fault(std::string name, std::string description, std::string expected) {
  CacheVariant v = cache_fault<Cache>(std::move(name), std::move(description), {expected});
  v.checks = serving_rows_for(expected);
  return v;
}

template <typename Schedule>
CacheVariant serving_loop_fault(std::string name, std::string description, std::string expected) {
  CacheVariant v = fault(std::move(name), std::move(description), {expected});
  v.serving = std::make_shared<Schedule>();
  v.checks = serving_rows_for(expected);
  return v;
}

template <typename Schedule>
CacheVariant loop_fault(std::string name, std::string description, std::vector<std::string> expected) {
  CacheVariant v = fault(std::move(name), std::move(description), std::move(expected));
  v.schedule = std::make_shared<Schedule>();
  return v;
}

template <typename Cache>
CacheVariant int8_fault(std::string name, std::string description) {
  CacheVariant v = cache_fault<Cache>(std::move(name), std::move(description), {check::kWindowReference, check::kTeacherForced});
  v.kv_budget = kInt8KvBudget;
  return v;
}

// The seed's two planted bugs, with the drift it reports for each on its Holmes model.
// A fault with what an engine showing it should do (CacheVariant::remedy).
inline CacheVariant remedy(CacheVariant v, std::string what_to_do) {
  v.remedy = std::move(what_to_do);
  return v;
}

inline CacheVariant seed_fault(CacheVariant v, int64_t seed_drift) {
  v.seed_drift = seed_drift;
  return v;
}

// A rolling cache with one decision changed; the base keeps the per-layer storage.
class FaultyCache : public KVCache {
 public:
  explicit FaultyCache(const Config& c) : context_(c.context), k_(c.n_layers), v_(c.n_layers) {}
  void reset() override {
    for (auto& t : k_) t = at::Tensor();
    for (auto& t : v_) t = at::Tensor();
  }
  int64_t length() const override { return k_[0].defined() ? k_[0].size(2) : 0; }
  int64_t bytes() const override {
    int64_t n = 0;
    for (size_t i = 0; i < k_.size(); ++i)
      if (k_[i].defined()) n += (k_[i].numel() + v_[i].numel()) * k_[i].element_size();
    return n;
  }

 protected:
  // Layer l's entries with `fresh` after them: (B, H, T, hd) and (B, H, t, hd) -> (B, H, T + t, hd).
  at::Tensor joined(const at::Tensor& old, const at::Tensor& fresh) const {
    return old.defined() ? at::cat({old, fresh}, 2) : fresh;
  }
  at::Tensor last(const at::Tensor& t, int64_t n) const {
    const int64_t keep = std::min(n, t.size(2));
    return t.narrow(2, t.size(2) - keep, keep);
  }
  // Keeps the last `context` entries of K, V (B, H, T, hd) as layer l's.
  void store(int64_t l, const at::Tensor& K, const at::Tensor& V) {
    k_[l] = last(K, context_);
    v_[l] = last(V, context_);
  }
  // The rolling cache's update, done right: k, v (B, H, t, hd) joined after layer l's entries, attended
  // whole, the last `context` kept. A fault changes one decision around it.
  std::pair<at::Tensor, at::Tensor> append(int64_t l, const at::Tensor& k, const at::Tensor& v) {
    at::Tensor K = joined(k_[l], k), V = joined(v_[l], v);
    store(l, K, V);
    return {K, V};
  }
  int64_t context_;
  std::vector<at::Tensor> k_, v_;
};

// A cache of in-place buffers behind a handle; the serving faults below change one operation.
class Wrapped : public KVCache {
 public:
  explicit Wrapped(std::shared_ptr<KVCache> inner) : inner_(std::move(inner)) {}
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override { return inner_->update(l, k, v); }
  void reset() override { inner_->reset(); }
  int64_t length() const override { return inner_->length(); }
  int64_t bytes() const override { return inner_->bytes(); }
  int64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  std::string row_ops_unsupported() const override { return ""; }
  void truncate(int64_t n) override { inner_->truncate(n); }

 protected:
  std::shared_ptr<KVCache> inner_;
};

// The seams' files, each adding its entries in the table's order (table.cpp calls them).
void register_policy_faults(FaultFile& r);
void register_storage_faults(FaultFile& r);
void register_loop_faults(FaultFile& r);
void register_batch_faults(FaultFile& r);
void register_serving_faults(FaultFile& r);
void register_int8_faults(FaultFile& r);
void register_zoo_faults(FaultFile& r);
void register_speculative_faults(FaultFile& r);

}  // namespace tinygpt::checks::faults

namespace tinygpt::checks {
// Adds every seam's entries to `registry`, in the table's order (cache_registry() calls it once).
void register_fault_table(CacheRegistry& registry);
}  // namespace tinygpt::checks
