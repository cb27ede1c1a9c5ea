#include "fault.h"

#include "tinygpt/checks/check_suite.h"
#include "tinygpt/fused_step.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt::checks::faults {

void FaultFile::add(CacheVariant v, std::vector<std::string> twins) {
  v.seam = seam_;
  v.twins = std::move(twins);
  registry_.add(std::move(v));
}

CacheVariant fault(std::string name, std::string description, std::vector<std::string> expected) {
  CacheVariant v;
  v.name = std::move(name);
  v.description = std::move(description);
  v.make_cache = [](const Config& c) { return std::make_unique<StaticKVCache>(c); };
  v.kernels = Kernels::Decode;
  v.make_step = [](KVCache& cache) { return std::make_unique<FusedCpuStep>(static_cast<StaticKVCache&>(cache)); };
  v.is_fault = true;
  v.expected = std::move(expected);
  return v;
}

std::vector<std::string> serving_rows_for(const std::string& expected) {
  std::vector<std::string> out;
  for (const auto& n : row_operation_checks())
    if (n == expected || !find_check(n).is(Tag::Long)) out.push_back(n);
  return out;
}

}  // namespace tinygpt::checks::faults
