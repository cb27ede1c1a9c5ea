// Cache implementations by name: every cache the harness verifies (production or fault) is a
// variant here - a KV cache factory plus the attention policy its decode steps use.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tinygpt/attention_policy.h"
#include "tinygpt/config.h"
#include "tinygpt/kv_cache.h"

namespace tinygpt::checks {

struct CacheVariant {
  std::string name;
  std::string description;  // for a fault: the real bug it models
  std::function<std::unique_ptr<KVCache>(const Config&)> make_cache;
  std::shared_ptr<const AttentionPolicy> policy;
  bool is_fault = false;
};

class CacheRegistry {
 public:
  void add(CacheVariant v);  // throws std::invalid_argument on a duplicate name
  // Throws std::invalid_argument listing the known names when `name` is unknown.
  const CacheVariant& get(const std::string& name) const;
  std::vector<const CacheVariant*> all(bool faults) const;
  std::string names() const;

 private:
  std::vector<CacheVariant> variants_;
};

// Production caches ("rolling") and every fault of faults.h.
const CacheRegistry& cache_registry();

}  // namespace tinygpt::checks
