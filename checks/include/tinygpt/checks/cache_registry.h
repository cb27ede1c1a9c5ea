// Cache implementations by name. Every decode path the harness verifies, production or fault, is
// a variant (cache_variant.h) here. Variants are registered at run time,
// so a user's cache joins every check (`tinygpt verify` included) without editing this repository.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "tinygpt/checks/cache_variant.h"

namespace tinygpt::checks {

class CacheRegistry {
 public:
  // Throws std::invalid_argument on an empty or duplicate name, a missing factory, a step
  // implementation combined with an attention policy (a fast step implements the production one), or
  // a fault naming a check (expected or run) that the check table does not have.
  void add(CacheVariant v);
  // Throws std::invalid_argument listing the known names when `name` is unknown.
  const CacheVariant& get(const std::string& name) const;
  // Production variants (faults = false) or faults, in registration order.
  std::vector<const CacheVariant*> all(bool faults) const;
  // The low-precision caches (faults = false) or their faults: the variants with a kv_budget.
  std::vector<const CacheVariant*> budgeted(bool faults) const;
  // The zoo's boundary faults (the variants with `applies`), in registration order.
  std::vector<const CacheVariant*> zoo_faults() const;
  std::string names() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<const CacheVariant>> variants_;  // stable addresses
};

// The series' own cache, the one the golden files are recorded through.
inline constexpr const char kSeriesCache[] = "rolling";
// The int8 cache's budget: mean KL(fp32 model || int8 cache) per step. Measured on the fixture
// (docs/checks.md, "Low-precision caches"): the int8 cache 7.6e-6 to 9.2e-6 over 600 tokens (its
// worst single step 2.7e-4), rounding by truncation 8.1e-5, the other planted faults 1.4e-2 and up.
// A budget is the user's decision (conform's --max-kl sets another); this one sits between the
// cache (3-4x inside) and its mildest fault (2.7x outside).
inline constexpr double kInt8KvBudget = 3e-5;

// The process-wide registry: "rolling" (the series' cache and arithmetic), "static" (the
// preallocated cache with the decode kernels), "cuda-graph" (a ring whose decode steps replay a CUDA
// graph) where LibTorch sees a GPU, and every fault of the fault table (tinygpt/checks/faults.h). Thread-safe.
CacheRegistry& cache_registry();

// Registers a production cache of the user's: it then runs through every check like ours, with
// the production attention policy and loop. Throws std::invalid_argument on a duplicate name.
void register_cache(const std::string& name, const std::string& description, CacheFactory factory,
                    Kernels kernels = Kernels::Library);

}  // namespace tinygpt::checks
