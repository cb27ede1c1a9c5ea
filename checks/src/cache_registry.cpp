#include "tinygpt/checks/cache_registry.h"

#include <stdexcept>

#include "faults.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/graph_step.h"
#include "tinygpt/ring_kv_cache.h"
#include "tinygpt/fused_step.h"
#include "tinygpt/static_kv_cache.h"

#include <torch/cuda.h>

namespace tinygpt::checks {

Decoder CacheVariant::decoder(const Config& cfg) const {
  Decoder d;
  d.cache = make_cache(cfg);
  if (!d.cache) throw std::logic_error("cache variant '" + name + "': its factory made no cache");
  if (make_step) d.step = make_step(*d.cache);
  if (policy) d.path.policy = policy.get();
  if (schedule) d.path.schedule = schedule.get();
  d.path.kernels = kernels;
  d.path.step = d.step.get();
  return d;
}

void CacheRegistry::add(CacheVariant v) {
  if (v.name.empty()) throw std::invalid_argument("cache registry: a cache needs a name");
  if (!v.make_cache) throw std::invalid_argument("cache registry: cache '" + v.name + "' has no factory");
  if (v.make_step && v.policy)
    throw std::invalid_argument("cache registry: cache '" + v.name + "' has a step function and an attention policy of its own");
  for (const auto* names : {&v.expected, &v.checks})
    for (const auto& c : *names) {
      try {
        find_check(c);
      } catch (const std::invalid_argument&) {
        throw std::invalid_argument("cache registry: '" + v.name + "' names check '" + c + "', which the check table does not have");
      }
    }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : variants_)
    if (e->name == v.name) throw std::invalid_argument("cache registry: duplicate name " + v.name);
  variants_.push_back(std::make_unique<const CacheVariant>(std::move(v)));
}

const CacheVariant& CacheRegistry::get(const std::string& name) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : variants_)
      if (e->name == name) return *e;
  }
  throw std::invalid_argument("unknown cache '" + name + "' (known: " + names() + ")");
}

std::vector<const CacheVariant*> CacheRegistry::all(bool faults) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const CacheVariant*> out;
  for (const auto& e : variants_)
    if (e->is_fault == faults) out.push_back(e.get());
  return out;
}

std::string CacheRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s;
  for (const auto& e : variants_) s += (s.empty() ? "" : ", ") + e->name;
  return s;
}

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
    register_faults(r);
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
