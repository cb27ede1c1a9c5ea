#include "tinygpt/checks/cache_registry.h"

#include <stdexcept>

#include "tinygpt/checks/check_suite.h"

namespace tinygpt::checks {

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
    if (e->is_fault == faults && !e->kv_budget && !e->applies) out.push_back(e.get());
  return out;
}

std::vector<const CacheVariant*> CacheRegistry::zoo_faults() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const CacheVariant*> out;
  for (const auto& e : variants_)
    if (e->applies) out.push_back(e.get());
  return out;
}

std::vector<const CacheVariant*> CacheRegistry::budgeted(bool faults) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const CacheVariant*> out;
  for (const auto& e : variants_)
    if (e->is_fault == faults && e->kv_budget) out.push_back(e.get());
  return out;
}

std::string CacheRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s;
  for (const auto& e : variants_) s += (s.empty() ? "" : ", ") + e->name;
  return s;
}

}  // namespace tinygpt::checks
