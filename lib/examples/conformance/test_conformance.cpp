// This project's cache and sampler under every tinygpt check: one line each.
#include <tinygpt/conformance/kv_cache_suite.h>
#include <tinygpt/conformance/sampler_suite.h>

#include "loop_sampler.h"
#include "paged_kv_cache.h"

TINYGPT_KV_CACHE_CONFORMANCE(PagedCache, [](const tinygpt::Config& c) { return std::make_unique<PagedKVCache>(c); });
TINYGPT_SAMPLER_CONFORMANCE(LoopSampler, loop_filtered, loop_pick);
