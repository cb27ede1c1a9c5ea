// The registry's contents: the production caches (the series' rolling cache, the static cache with
// its fused step, the CUDA graph's ring where LibTorch sees a GPU) and every fault (the fault table, checks/src/faults/).
// Kept apart from the registry itself, which knows neither.
#include <torch/cuda.h>

#include "fault.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/fused_step.h"
#include "tinygpt/graph_step.h"
#include "tinygpt/int8_kv_cache.h"
#include "tinygpt/ring_kv_cache.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt::checks {

CacheRegistry& cache_registry() {
  // Built once, never destroyed: users may register caches from static initialisers of their own.
  static CacheRegistry* registry = [] {
    auto* reg = new CacheRegistry;
    CacheRegistry& r = *reg;
    CacheVariant rolling;
    rolling.name = kSeriesCache;
    rolling.description = "the series' cache and arithmetic: torch.cat per step, attend to up to context+1 keys, keep the last context";
    rolling.make_cache = [](const Config& c) { return std::make_unique<RollingKVCache>(c); };
    r.add(std::move(rolling));
    CacheVariant fast;
    fast.name = "static";
    fast.description = "preallocated K/V buffers written in place, with our decode kernels in one fused step (the fastest CPU path)";
    fast.make_cache = [](const Config& c) { return std::make_unique<StaticKVCache>(c); };
    fast.kernels = Kernels::Decode;
    // The fused step writes into the cache the factory made just before (a prefill, a GPU: the model's step).
    fast.make_step = [](KVCache& cache) { return std::make_unique<FusedCpuStep>(static_cast<StaticKVCache&>(cache)); };
    r.add(std::move(fast));
    if (torch::cuda::is_available()) {
      CacheVariant graph;
      graph.name = "cuda-graph";
      graph.description = "a ring of context + 1 slots with device-side positions: on CUDA each decode step replays one captured graph";
      graph.make_cache = [](const Config& c) { return std::make_unique<RingKVCache>(c); };
      // The graph step reads the ring it is bound to; the factory made that ring just before.
      graph.make_step = [](KVCache& cache) { return std::make_unique<GraphStep>(static_cast<RingKVCache&>(cache)); };
      r.add(std::move(graph));
    }
    CacheVariant int8;
    int8.name = "int8";
    int8.description = "keys and values stored as int8, one absmax scale per token per head for K and for V, "
                       "dequantized for attention; judged by its KL budget";
    int8.make_cache = [](const Config& c) { return std::make_unique<Int8KVCache>(c); };
    int8.kernels = Kernels::Decode;
    int8.kv_budget = kInt8KvBudget;
    r.add(std::move(int8));
    register_fault_table(r);
    return reg;
  }();
  return *registry;
}

void register_cache(const std::string& name, const std::string& description, CacheFactory factory,
                    Kernels kernels) {
  CacheVariant v;
  v.name = name;
  v.description = description;
  v.make_cache = std::move(factory);
  v.kernels = kernels;
  cache_registry().add(std::move(v));
}

}  // namespace tinygpt::checks
