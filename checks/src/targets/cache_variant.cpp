#include "tinygpt/checks/cache_variant.h"

#include <stdexcept>

namespace tinygpt::checks {

std::string CacheVariant::unsupported(const Config& cfg) const {
  try {
    make_cache(cfg);  // a cache refuses a config it cannot hold when it is made (StaticKVCache(cfg), ...)
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

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

}  // namespace tinygpt::checks
