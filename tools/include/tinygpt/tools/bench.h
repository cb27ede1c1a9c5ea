// The seed's benchmark (SPEC 7): tokens per second with and without the cache, per cache
// implementation, plus the cache's memory against the formula and the process's peak memory.
// Untrained weights (seed 0), greedy, float32, a random prompt; timings are wall clock around
// whole generate calls (synchronised on CUDA). Leaves out statistics over repeats: one timed run
// per cell after a warm-up, as the seed did; compare ratios from one run, not numbers across runs.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tinygpt/config.h"
#include "tinygpt/gpt.h"

namespace tinygpt::tools {

struct MachineInfo {
  std::string cpu, libtorch, blas, device;
  std::string blas_core;  // "Zen (chosen by OpenBLAS)": the kernels LibTorch's products run on (blas.h)
  std::string kernels;    // the decode kernels' path in force (kernels.h): "avx2" or "portable"
  int threads = 1;
  // How OpenMP's idle threads wait, as this process runs: OMP_WAIT_POLICY and libgomp's GOMP_SPINCOUNT
  // ("PASSIVE, GOMP_SPINCOUNT=10000": a bounded spin, then sleep; tinygpt's own choice, cli/runtime.cpp).
  std::string wait_policy;
  bool reference_blas = false;  // LibTorch's products run on reference BLAS (~17x slower)
  double product_flops_s = 0;   // measured by run_bench (measure_product_rate); 0 when not measured
  static MachineInfo current(c10::Device device);
  nlohmann::json to_json() const;
};

struct BenchOptions {
  std::vector<int64_t> batches{1, 16};
  std::vector<int64_t> tokens{64, 256, 1024};
  std::vector<std::string> caches{"rolling", "static"};
  int64_t prompt_len = 8;
  int64_t warmup = 16;  // tokens of each path per batch before timing
  uint64_t prompt_seed = 0;
  bool uncached = true;  // time the uncached loop too (its cost grows with the window)
  // Every cell at each of these intra-op thread counts (empty: the threads in force), so one run shows
  // where a second thread pays; the threads in force are restored after.
  std::vector<int> thread_counts;
};

struct BenchRow {
  std::string cache;
  int64_t batch = 0, tokens = 0;
  int threads = 1;  // intra-op threads the cell ran with
  double uncached_tok_s = 0, cached_tok_s = 0, speedup = 0;  // uncached 0 when not timed
  double bound_tok_s = 0;    // what this machine allows the cell (see run_bound_seconds)
  double read_bytes_s = 0;   // the read rate measured over the cell's bytes of one step
};

// The roofline of a cached greedy run, measured on this machine rather than taken from a data
// sheet. A step (the prefill of the prompt, then one per new token) reads every weight once and
// the cache's keys and values (min(fill, context) + 1 per layer and row), and does 2 FLOPs per
// weight per query row (the head only for the last position) plus 4 x d per key and query in
// attention. It cannot take less than max(bytes / read rate, FLOPs / product rate); a run is the
// sum of its steps. Leaves out the cache writes, norms, RoPE and the embedding (under 1% of either).
struct StepCost {
  double bytes = 0, flops = 0;
};
// Step costs of one run: prompt_len prompt tokens, then `tokens` new ones (the first from the prefill).
std::vector<StepCost> run_step_costs(const Config& cfg, int64_t batch, int64_t prompt_len, int64_t tokens);
double run_bound_seconds(const std::vector<StepCost>& steps, double read_bytes_s, double flops_s);
// Bytes per second that one pass over `bytes` of memory achieves on `device` (all intra-op threads,
// best of several passes after a warm-up), and the FLOP rate of a 1024^3 float32 matrix product.
double measure_read_rate(c10::Device device, int64_t bytes);
double measure_product_rate(c10::Device device);

struct CacheMemory {
  std::string cache;
  int64_t bytes = 0, capacity_bytes = 0, formula_bytes = 0;  // at a full window, batch 1
};

struct BenchReport {
  MachineInfo machine;
  std::vector<BenchRow> rows;
  std::vector<CacheMemory> memory;
  int64_t peak_rss_bytes = 0;
  nlohmann::json to_json() const;
  std::string format() const;
};

BenchReport run_bench(GPT& model, const BenchOptions& opts, const std::function<void(const std::string&)>& progress = {});

// Where one decode step's time goes (`batch` rows, the cache filled to `context_fill`), each part
// timed alone with the model's shapes and the chosen cache's kernels: weight products, attention,
// norms, RoPE, cache writes; the rest is the step's time minus their sum: LibTorch dispatch, views,
// allocation, the embedding, and what the parts lose inside a real step, where each layer's K and V
// and every weight come from memory (timed alone, one K, V and the weights stay in cache, and a
// part looks several times faster than it is inside a step: docs/perf.md).
// A cache whose step is the fused CPU step (`static`) is timed inside its real steps instead
// (FusedStepProfile): every part of the step as a user's decode pays it, and the rest is only what
// lies outside them.
struct StepProfile {
  std::string cache;
  int64_t batch = 1;
  bool inside_step = false;  // parts timed inside real steps (the fused step) rather than alone
  double step_us = 0;
  std::vector<std::pair<std::string, double>> parts_us;
  nlohmann::json to_json() const;
  std::string format() const;
};
StepProfile profile_step(GPT& model, const std::string& cache, int64_t context_fill, int64_t batch = 1);

}  // namespace tinygpt::tools

namespace tinygpt::checks {
class LoadedEngine;
}  // namespace tinygpt::checks

namespace tinygpt::tools {

// Ours against a conform engine's own decode loop (`tinygpt bench --vs-engine CMD`), one run: the
// same checkpoint, the same greedy prompts (batch rows of prompt_len ids), the same number of
// decode steps inside the window, the same threads. The engine times its loop itself (the protocol's
// `bench` request: JSON never enters the timing); ours is timed the same way around the production
// loop with the chosen cache: from the first token chosen after the prefill to the last step's
// logits. Each cell interleaves the two `reps` times and keeps each side's best run; the greedy
// tokens of both are compared (the engine did the same work). Every cell also gets the machine's
// bound for its decode steps (see run_bound_seconds).
struct VsEngineOptions {
  std::vector<int64_t> batches{1, 16};
  int64_t steps = 240;      // decode steps per run (prompt_len + steps <= context)
  int64_t prompt_len = 8;
  std::string cache = "static";
  int reps = 3;
  uint64_t prompt_seed = 0;
};

struct VsEngineRow {
  int64_t batch = 0, steps = 0;
  double ours_tok_s = 0, engine_tok_s = 0, ratio = 0;  // ratio = ours / engine
  std::vector<double> ours_runs, engine_runs;          // tok/s of every rep
  double bound_tok_s = 0;
  int64_t tokens_agree = 0, tokens = 0;                // greedy tokens equal between the two, of all
};

struct VsEngineReport {
  MachineInfo machine;
  std::string engine, command, cache, checkpoint;
  int64_t prompt_len = 0;
  int reps = 0;
  std::vector<VsEngineRow> rows;
  nlohmann::json to_json() const;
  std::string format() const;
};

// Throws EngineUnusable when the engine has no `bench` operation or answers it wrongly.
VsEngineReport run_vs_engine(checks::LoadedEngine& engine, const std::string& command, const VsEngineOptions& opts,
                             const std::function<void(const std::string&)>& progress = {});

}  // namespace tinygpt::tools
