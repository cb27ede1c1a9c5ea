// Cache implementations by name. Every decode path the harness verifies, production or fault, is
// a variant here: a KV cache factory plus the attention policy, loop schedule, product kernels and
// (optionally) the step implementation its decode steps use. Variants are registered at run time,
// so a user's cache joins every check (`tinygpt verify` included) without editing this repository.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tinygpt/attention_policy.h"
#include "tinygpt/config.h"
#include "tinygpt/decode_step.h"
#include "tinygpt/decode_schedule.h"
#include "tinygpt/generate.h"
#include "tinygpt/gpt.h"
#include "tinygpt/kv_cache.h"
#include "tinygpt/kernels.h"
#include "tinygpt/serving.h"
#include "tinygpt/speculative.h"

namespace tinygpt::checks {

using CacheFactory = std::function<std::unique_ptr<KVCache>(const Config&)>;
// A step implementation bound to the cache it was made for (see tinygpt/decode_step.h).
using StepFactory = std::function<std::unique_ptr<StepFunction>(KVCache&)>;

// What one run decodes with: a cache of its own, the step implementation bound to it (if any),
// and the path generate_cached takes (pointers into the variant and into `step`).
struct Decoder {
  std::unique_ptr<KVCache> cache;
  std::unique_ptr<StepFunction> step;
  DecodePath path;
};

struct CacheVariant {
  std::string name;
  std::string description;  // for a fault: the real bug it models
  CacheFactory make_cache;
  StepFactory make_step;                            // null: the model's reference step
  std::shared_ptr<const AttentionPolicy> policy;    // null: production
  std::shared_ptr<const DecodeSchedule> schedule;   // null: production
  std::shared_ptr<const ServingSchedule> serving;   // the serving loop's bookkeeping; null: production
  std::shared_ptr<const SpeculativeRules> speculative;  // a speculative round's decisions; null: production
  // A fault of the model's arithmetic (a zoo fault): the model its runs compute with, built from the
  // model under test (tinygpt/gpt.h's model_variant: the same weights, a formula stated otherwise).
  // Null: the model itself. Read through model().
  std::function<GPT(const GPT&)> make_model;
  Kernels kernels = Kernels::Library;
  bool is_fault = false;
  // For a fault: the checks that must catch it on any model (logit-level evidence); the fault
  // matrix fails when one of them misses it.
  std::vector<std::string> expected;
  // The checks its run of the fault matrix makes: empty, the default set. A serving fault runs the
  // serving checks (the default ones never drive rows apart).
  std::vector<std::string> checks;
  // For a fault the seed itself plants: the drift (identical greedy tokens) the seed reports for it.
  std::optional<int64_t> seed_drift;
  // A low-precision cache (and its faults): judged by mean KL per step against our fp32 model at this
  // budget (Tolerances::max_kl), not by the fp32 bound; kept out of all() (its own list: budgeted()).
  std::optional<double> kv_budget;
  // A zoo fault (SPEC 10): the members with its feature, where it must be caught (null: a fault of the
  // seed's architecture). On a member without the feature it is the production path. Kept out of all()
  // (its own list: zoo_faults()).
  std::function<bool(const Config&)> applies;
  std::string feature;  // the feature, in words ("a sliding layer")
  // For a fault: the file of checks/src/faults/ its entry is in (its seam: "policy", "storage", "loop",
  // "batch", "serving", "int8", "zoo", "speculative"), and its engine twins - the planted faults of the
  // engine adapters that are the same bug, "adapter:name" (engines/<adapter>/faults.txt), which a
  // diagnosis of that engine must name this fault for.
  std::string seam;
  std::vector<std::string> twins;
  // For a fault a real engine is likely to show, on purpose or by a known bug: what to do about it, in
  // the words a diagnosis that names it ends with ("" : the diagnosis ends with its description).
  std::string remedy;

  // A fresh cache and step for one run, and the path through them (valid while the variant lives).
  Decoder decoder(const Config& cfg) const;
  // The model this variant's runs compute with: `m`, or the variant make_model builds from it.
  GPT model(const GPT& m) const { return make_model ? make_model(m) : m; }
  // "" when this variant runs a model of `cfg`; else why not, in one line (a fast cache refusing a zoo
  // member's knob, SPEC 10).
  std::string unsupported(const Config& cfg) const;
};

class CacheRegistry {
 public:
  // Throws std::invalid_argument on an empty or duplicate name, a missing factory, a step
  // implementation combined with an attention policy (a fast step implements the production one), or
  // a fault naming a check (expected or run) that the check table does not have.
  void add(CacheVariant v);
  // Throws std::invalid_argument listing the known names when `name` is unknown.
  const CacheVariant& get(const std::string& name) const;
  // Production variants (faults = false) or faults, in registration order.
  std::vector<const CacheVariant*> all(bool faults) const;
  // The low-precision caches (faults = false) or their faults: the variants with a kv_budget.
  std::vector<const CacheVariant*> budgeted(bool faults) const;
  // The zoo's boundary faults (the variants with `applies`), in registration order.
  std::vector<const CacheVariant*> zoo_faults() const;
  std::string names() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<const CacheVariant>> variants_;  // stable addresses
};

// The series' own cache, the one the golden files are recorded through.
inline constexpr const char kSeriesCache[] = "rolling";
// The int8 cache's budget: mean KL(fp32 model || int8 cache) per step. Measured on the fixture
// (docs/checks.md, "Low-precision caches"): the int8 cache 7.6e-6 to 9.2e-6 over 600 tokens (its
// worst single step 2.7e-4), rounding by truncation 8.1e-5, the other planted faults 1.4e-2 and up.
// A budget is the user's decision (conform's --max-kl sets another); this one sits between the
// cache (3-4x inside) and its mildest fault (2.7x outside).
inline constexpr double kInt8KvBudget = 3e-5;

// The process-wide registry: "rolling" (the series' cache and arithmetic), "static" (the
// preallocated cache with the decode kernels), "cuda-graph" (a ring whose decode steps replay a CUDA
// graph) where LibTorch sees a GPU, and every fault of the fault table (tinygpt/checks/faults.h). Thread-safe.
CacheRegistry& cache_registry();

// Registers a production cache of the user's: it then runs through every check like ours, with
// the production attention policy and loop. Throws std::invalid_argument on a duplicate name.
void register_cache(const std::string& name, const std::string& description, CacheFactory factory,
                    Kernels kernels = Kernels::Library);

}  // namespace tinygpt::checks
