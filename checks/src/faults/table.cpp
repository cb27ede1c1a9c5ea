// The fault table as the harness reads it (tinygpt/checks/faults.h), and the order the seams' files
// register their entries in.
#include "tinygpt/checks/faults.h"

#include "fault.h"

namespace tinygpt::checks {

void register_fault_table(CacheRegistry& registry) {
  using namespace faults;
  const std::pair<const char*, void (*)(FaultFile&)> seams[] = {
      {"policy", register_policy_faults}, {"storage", register_storage_faults}, {"loop", register_loop_faults},
      {"batch", register_batch_faults},   {"serving", register_serving_faults}, {"int8", register_int8_faults},
      {"zoo", register_zoo_faults},       {"speculative", register_speculative_faults},
  };
  for (const auto& [seam, add] : seams) {
    FaultFile file(registry, seam);
    add(file);
  }
}

std::vector<const CacheVariant*> fault_table() {
  const CacheRegistry& r = cache_registry();
  std::vector<const CacheVariant*> out = r.all(/*faults=*/true);
  for (const CacheVariant* b : r.budgeted(/*faults=*/true)) out.push_back(b);
  for (const CacheVariant* z : r.zoo_faults()) out.push_back(z);
  return out;
}

std::string fault_refusal(const CacheVariant& f, const Config& cfg) {
  if (f.applies) return f.applies(cfg) ? "" : "needs " + f.feature + ", which this model lacks";
  if (!cfg.is_seed_architecture()) return "is stated for the seed's architecture; this model sets " + cfg.zoo_knob() + " (SPEC 10)";
  return "";
}

FaultChoice faults_for(const Config& cfg, FaultUse use, const std::vector<const CacheVariant*>* among) {
  FaultChoice out;
  const std::string knob = cfg.zoo_knob();
  size_t seed_faults = 0;
  for (const CacheVariant* f : among ? *among : fault_table()) {
    if (f->kv_budget && use != FaultUse::Matrix) continue;
    if (f->applies && !f->applies(cfg)) {
      // On the seed's architecture every zoo fault lacks its feature: not worth a line each.
      if (use == FaultUse::Matrix && !knob.empty())
        out.left_out.push_back("fault " + f->name + " left out: it " + fault_refusal(*f, cfg));
      continue;
    }
    // The seed's faults state what must catch them on the seed's architecture; on a zoo member one may be
    // benign (a storage fault the sliding window's band hides). A diagnosis still weighs them.
    if (!f->applies && !knob.empty() && use != FaultUse::Diagnosis) {
      ++seed_faults;
      continue;
    }
    out.faults.push_back(f);
  }
  if (seed_faults && use == FaultUse::Matrix)
    out.left_out.push_back(std::to_string(seed_faults) + " faults of the seed's architecture left out: what must catch them is stated "
                           "for it, and this model sets " + knob + " (SPEC 10)");
  return out;
}

}  // namespace tinygpt::checks
