// Fault-injected decode paths: each one a different implementation behind one seam (attention
// policy, KV cache or loop schedule),
// modelling a real bug report. None of them lives in lib/.
#pragma once

#include "tinygpt/checks/cache_registry.h"

namespace tinygpt::checks {

void register_faults(CacheRegistry& registry);
// The zoo's boundary faults (zoo_faults.cpp).
void register_zoo_faults(CacheRegistry& registry);

}  // namespace tinygpt::checks
