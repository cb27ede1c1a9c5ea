// Fault-injected decode paths: each one a different implementation behind one seam (attention
// policy, KV cache or loop schedule),
// modelling a real bug report. None of them lives in lib/.
#pragma once

#include "tinygpt/checks/cache_registry.h"

namespace tinygpt::checks {

// A fault is the `static` production path - the preallocated cache, the decode kernels and the fused
// step (cache_registry.cpp) - with one decision changed; the caller changes it. Loop and serving-loop
// faults keep all of it.
CacheVariant fault(std::string name, std::string description, std::vector<std::string> expected);

void register_faults(CacheRegistry& registry);
// The zoo's boundary faults (zoo_faults.cpp).
void register_zoo_faults(CacheRegistry& registry);
// Speculative decoding's faults (faults/speculative.cpp): one rule of a round changed each; the zoo's
// among them apply where their feature is.
void register_speculative_faults(CacheRegistry& registry);
void register_speculative_zoo_faults(CacheRegistry& registry);

}  // namespace tinygpt::checks
