// `tinygpt conform` as a library call: an inference engine in any language, started as a child
// process and driven over a line-based JSON protocol (docs/protocol.md), run through the rows of
// the check table (check_suite.h) like any other target, against our reference model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tinygpt/checkpoint.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/diagnose.h"
#include "tinygpt/checks/engine_unusable.h"
#include "tinygpt/checks/kv_cost.h"
#include "tinygpt/checks/repro.h"
#include "tinygpt/checks/results.h"

namespace tinygpt::checks {

// A weight type's default budget, mean KL per step: 1e-3 for an 8-bit type, 5e-2 for 4-bit ones
// (q4_0, q4_K_M), 0 for f32 (docs/checks.md, "Quantized weights", has what llama.cpp's cost).
double default_weight_budget(const std::string& weight_type);

struct ConformOptions {
  std::string engine;      // the command line, run through /bin/sh -c
  std::string checkpoint;  // .pt or .safetensors; empty: the shipped fixture
  int64_t tokens = 600;
  bool no_past_window = false;  // never step past the context (the past-window comparisons say so)
  double timeout_s = 30;        // per answer
  // Check groups: "all", or names of model checks (tokens, logits, window-reference, reset,
  // teacher-forced, sampled, long-prompt, batch, self) and "sampler" (every sampler row that holds
  // for a sampler seen through its draws).
  std::vector<std::string> groups{"all"};
  // The rows of statistical power (spec-distribution: thousands of speculative runs) run only with
  // `deep` or when named in `groups`; `spec_draws` > 0 sets their draws (0: what their power needs).
  bool deep = false;
  int64_t spec_draws = 0;
  Tolerances tolerance;
  int64_t self_stride = 0;  // the self check prefills every self_stride-th in-window step (and the last); 0: its default choice
  bool require_batch_invariance = false;  // batch-sizes fails on any difference from a row alone
  std::vector<int64_t> batch_sizes;       // batch-sizes' sizes, ascending (empty: EquivalenceOptions' default)
  bool require_thread_invariance = false;  // thread-counts fails on any difference from 1 thread
  // After a run with failing model rows: match them against the fault catalogue on our model (diagnose.h).
  bool diagnose = false;
  uint64_t variation = 0;  // held-out runs of the serving rows (EquivalenceOptions::variation; --vary)
  // The engine's KV cache type, sent as load's "kv_type" (f16, q8_0, ...: names its hello lists in
  // "kv_types"); empty: the engine's default. A name the engine does not list: std::invalid_argument.
  std::string kv_type;
  // The cost of a low-precision KV cache (with kv_type, and each of kv_compare): the teacher-forced run
  // of the `teacher-forced` row through the engine with that type and through the same engine with an
  // fp32 cache (its "f32", when hello's kv_types lists it: the same engine and approximations, only the
  // cache's precision differs), each position's KL and top-1 against both that run and our model. A row
  // `kv-budget [TYPE]` per type passes when the mean KL per step against the fp32-cache run (our model
  // where the engine has none) is at most kv_budget and, when set, the top-1 agreement at least
  // kv_min_top1.
  double kv_budget = 3e-5;  // kInt8KvBudget: the user's decision (docs/checks.md, "Low-precision caches")
  std::optional<double> kv_min_top1;  // in (0, 1]; unset: KL alone
  std::vector<std::string> kv_compare;
  // The engine's weight type, sent as load's "weight_type" (q8_0, q4_0, q4_K_M: names its hello lists
  // in "weight_types"; the engine quantizes the float32 file it is sent); empty: float32 as written.
  // Every row is judged against our model by mean KL per step at weight_budget (plus kv_budget with
  // a low-precision cache) instead of the fp32 |diff| bound, and is also sent to the same engine with
  // f32 weights (and cache), each row saying what the type costs against it; a row
  // `weight-budget [TYPE]` costs the teacher-forced run against both, judged by weight_budget.
  std::string weight_type;
  // The user's decision (docs/checks.md, "Quantized weights"); unset: default_weight_budget(weight_type).
  std::optional<double> weight_budget;
  // Each failing row's requests shrunk to a short sequence that still fails the same way, written as a
  // bundle (repro.h) into repro_dir/ROW/; empty: none. Shrinking a row stops after repro_budget_s seconds.
  // Not with a low-precision cache or weights, or bounds of the distribution (a bundle judges max |diff|).
  std::string repro_dir;
  double repro_budget_s = 120;
  std::vector<std::string> repro_keep;  // operations every shrunk sequence keeps (ReproSetup::keep_ops)
  std::function<void(const std::string&)> progress;
  // weight_budget, or the type's default.
  double weights_budget() const { return weight_budget.value_or(default_weight_budget(weight_type)); }
};

class DecodeTarget;
// Each type's cost (o.kv_type, then o.kv_compare): `main` is the engine loaded with o.kv_type; each
// other type and the fp32 baseline are another instance of the engine (o.engine loaded again).
// `baseline`, when given, is the engine already loaded with its f32 cache (else one is started).
std::vector<KvCost> kv_costs(const ConformOptions& o, const nlohmann::json& hello, DecodeTarget& main, const EquivalenceOptions& eo,
                             const Reference& ref, int64_t vocab, int64_t context, DecodeTarget* baseline = nullptr);
// What o.weight_type costs (`weight-budget [TYPE]`, judged by o.weights_budget()): the teacher-forced run
// through `main` against the same engine with f32 weights at o.kv_type's cache, when hello's weight_types
// lists f32 (`baseline` when one runs already, else another instance), and against our model.
KvCost weight_cost(const ConformOptions& o, const nlohmann::json& hello, DecodeTarget& main, const EquivalenceOptions& eo,
                   const Reference& ref, int64_t vocab, int64_t context, DecodeTarget* baseline = nullptr);

struct ConformReport {
  std::string engine_name, command, checkpoint, format, kv_type, weight_type;
  int protocol = 1;
  std::vector<std::string> deviations;  // declared by the engine's hello
  std::vector<CheckResult> rows;
  EquivalenceResult model;              // the model checks' figures (plots, statistics)
  int64_t requests = 0;
  std::optional<std::string> fatal;     // the engine stopped being usable mid-run (exit 2)
  Diagnosis diagnosis;                  // with ConformOptions::diagnose and failing model rows
  std::vector<KvCost> kv;               // with ConformOptions::kv_type or kv_compare (and weight_type): each type's cost
  bool past_window = true;              // false: kept inside the window (--no-past-window, or declared no-window)
  std::vector<ReproResult> repros;      // with ConformOptions::repro_dir: one per failing row
  bool passed() const { return !fatal && all_ok(rows); }
};

// The model check names `groups` selects, in table order (a group of model checks that need the
// main run also runs it). Throws std::invalid_argument on an unknown group.
std::vector<std::string> conform_selection(const std::vector<std::string>& groups, bool deep = false);

class EngineProcess;

// The KV cache types an engine's hello lists in "kv_types" (empty when it lists none).
std::vector<std::string> hello_kv_types(const nlohmann::json& hello);
// The weight types it lists in "weight_types" (empty when it lists none).
std::vector<std::string> hello_weight_types(const nlohmann::json& hello);

// The precision an engine is loaded at: load's "kv_type" and "weight_type" (empty: not sent).
struct EnginePrecision {
  std::string kv_type, weight_type;
};

// An engine started, greeted (hello, protocol 2 offered) and loaded with a checkpoint written in the
// first format it names that we write; our model loaded from the same checkpoint. What conform and
// `tinygpt bench --vs-engine` start from. Throws EngineUnusable when any of that fails; the
// destructor ends the engine and removes the written file.
class LoadedEngine {
 public:
  // precision: load's "kv_type" and "weight_type" (empty: not sent); std::invalid_argument when hello's
  // "kv_types" or "weight_types" does not list one.
  LoadedEngine(const std::string& command, const std::string& checkpoint, double timeout_s,
               const std::function<void(const std::string&)>& progress = {}, const EnginePrecision& precision = {});
  ~LoadedEngine();
  LoadedEngine(const LoadedEngine&) = delete;
  LoadedEngine& operator=(const LoadedEngine&) = delete;

  const std::string& name() const;        // hello's "name"
  const std::string& format() const;      // the format it loaded
  const std::string& checkpoint() const;  // the checkpoint given (the fixture when empty)
  const nlohmann::json& hello() const;
  int protocol() const;                   // 1, or 2 when hello answered protocol 2
  bool supports(const std::string& op) const;  // protocol 2 and op in hello's "operations"
  GPT& model();                           // ours, from the same checkpoint (CPU)
  // Another model (a speculative draft, read from `ck`) in the first format hello lists that carries its
  // architecture, written into the engine's private folder as `stem`.FORMAT: the path the engine is sent.
  std::string write_model(const Checkpoint& ck, GPT& model, const std::string& stem);
  // One request and its answer (ok or not); throws EngineUnusable when the engine cannot answer.
  nlohmann::json call(const nlohmann::json& request);
  EngineProcess& process();
  const nlohmann::json& load_request() const;  // the load request as sent
  const std::string& model_file() const;       // the model as the engine loaded it (removed with this object)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws EngineUnusable when the engine cannot be started, loaded or greeted; otherwise returns
// every selected row (a fatal mid-run failure is in `fatal`, the remaining rows as errors).
ConformReport run_conform(const ConformOptions& opts);

}  // namespace tinygpt::checks
