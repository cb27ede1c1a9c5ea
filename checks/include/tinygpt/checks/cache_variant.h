// One decode path the harness verifies, production or fault: a KV cache factory plus the attention
// policy, loop schedule, product kernels and (optionally) the step implementation its decode steps
// use, or the model variant a fault of the model's arithmetic computes with. The registry of them by
// name is cache_registry.h; a decode target (target.h) runs one.
#pragma once

#include <functional>
#include <memory>
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
  // For a fault: why it computes exactly what the correct path computes on model `m`, where the fault can
  // name that from the weights or the config ("the QK-norm weight is equal on each pair of channels RoPE
  // turns together: the norm commutes with the rotation"); "" where it can show, or cannot tell. Null:
  // it names no reason. The fault matrix measures every missed fault's effect either way (inject.h);
  // this only says why a fault with none has none.
  std::function<std::string(const GPT& m)> inert_on;

  // A fresh cache and step for one run, and the path through them (valid while the variant lives).
  Decoder decoder(const Config& cfg) const;
  // The model this variant's runs compute with: `m`, or the variant make_model builds from it.
  GPT model(const GPT& m) const { return make_model ? make_model(m) : m; }
  // "" when this variant runs a model of `cfg`; else why not, in one line (a fast cache refusing a zoo
  // member's knob, SPEC 10).
  std::string unsupported(const Config& cfg) const;
};

}  // namespace tinygpt::checks
