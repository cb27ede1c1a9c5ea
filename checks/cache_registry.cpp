#include "cache_registry.h"

#include <stdexcept>

#include "faults.h"

namespace tinygpt::checks {

void CacheRegistry::add(CacheVariant v) {
  for (const auto& e : variants_)
    if (e.name == v.name) throw std::invalid_argument("cache registry: duplicate name " + v.name);
  variants_.push_back(std::move(v));
}

const CacheVariant& CacheRegistry::get(const std::string& name) const {
  for (const auto& e : variants_)
    if (e.name == name) return e;
  throw std::invalid_argument("unknown cache '" + name + "' (known: " + names() + ")");
}

std::vector<const CacheVariant*> CacheRegistry::all(bool faults) const {
  std::vector<const CacheVariant*> out;
  for (const auto& e : variants_)
    if (e.is_fault == faults) out.push_back(&e);
  return out;
}

std::string CacheRegistry::names() const {
  std::string s;
  for (const auto& e : variants_) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

const CacheRegistry& cache_registry() {
  static const CacheRegistry registry = [] {
    CacheRegistry r;
    r.add({"rolling", "the series' cache: append, attend to up to context+1 keys, keep the last context",
           [](const Config& c) { return std::make_unique<RollingKVCache>(c); },
           std::shared_ptr<const AttentionPolicy>(&production_policy(), [](const AttentionPolicy*) {}),
           false});
    register_faults(r);
    return r;
  }();
  return registry;
}

}  // namespace tinygpt::checks
