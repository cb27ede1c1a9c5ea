// Fault-injected caches: each one a different implementation behind the seams (policy or cache),
// modelling a real bug report. None of them lives in lib/.
#pragma once

#include "cache_registry.h"

namespace tinygpt::checks {

void register_faults(CacheRegistry& registry);

}  // namespace tinygpt::checks
