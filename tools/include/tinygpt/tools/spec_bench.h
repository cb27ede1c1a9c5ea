// `tinygpt bench --speculative`: the seed's table for speculative decoding (speculative.h). Plain cached
// greedy decoding against the speculative decoder, per draft x batch x k x threads, on a TRAINED target
// (acceptance is what the draft learned: untrained weights would say nothing): tok/s of each, their ratio,
// the acceptance rate and the mean accepted length (ids per round), and whether the speculative ids are
// plain greedy's (lossless). The decoder runs on the production path's cache and kernels (the static
// cache; its verify steps' k + 1 rows and a model draft's steps through the decode kernels). Two plain
// baselines, both timed in the cell: the series' path (the rolling cache and the model's own step, what
// the seed's bench times) and the production path (the static cache, the decode kernels and the fused
// step): the ratio against the production path is the one that says whether speculation pays. Batch B:
// B different prompts speculating together in one RowBatch (one batched verify step a round, each row
// accepting its own count) against plain decoding of the B rows together, and against the same rows
// speculating one after another, each in a decoder of its own (what batching the verify step buys).
// One timed run per cell after a warm-up, as the seed's bench; compare ratios within one run.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tinygpt/checks/conform.h"
#include "tinygpt/gpt.h"
#include "tinygpt/tools/bench.h"

namespace tinygpt::tools {

struct SpecBenchOptions {
  std::vector<int64_t> batches{1, 4};
  std::vector<int64_t> widths{2, 4, 8};
  std::vector<std::string> drafts{"model", "ngram"};  // "model": the trained draft; also "self"
  std::vector<int> thread_counts;                     // empty: the threads in force
  int64_t tokens = 256;  // new ids per row
};

struct SpecBenchRow {
  std::string draft;
  int64_t batch = 0, k = 0;
  int threads = 1;
  double plain_tok_s = 0;       // the rolling cache and the model's own step: the decoder's own path
  double production_tok_s = 0;  // the static cache with the decode kernels and the fused step
  double spec_tok_s = 0;
  double alone_tok_s = 0;  // batch > 1: the rows speculating one after another (0 at batch 1)
  double acceptance = 0, mean_accepted_length = 0;
  bool lossless = false;  // every row's ids equal plain greedy's
  double speedup() const { return production_tok_s > 0 ? spec_tok_s / production_tok_s : 0; }
};

struct SpecBenchReport {
  MachineInfo machine;
  std::string target, draft;  // what each is, in words
  std::vector<SpecBenchRow> rows;
  nlohmann::json to_json() const;
  std::string format() const;
};

// `draft` may be null: the "model" draft's cells are then left out (said in the report's draft line).
SpecBenchReport run_spec_bench(GPT& target, GPT draft, const SpecBenchOptions& opts,
                               const std::function<void(const std::string&)>& progress = {});

// `bench --speculative --vs-engine CMD`: a conform engine's own speculative decoding (op 'speculate') at
// batch 1, timed by the engine (its answer's decode_s: prefill and rounds, not the answer's JSON): plain
// (the draft "none") against each draft kind it offers of `opts.drafts` at each k, greedy, one timed run
// after a warm-up, with its acceptance counts and whether its ids are its own plain greedy ids.
struct SpecEngineRow {
  std::string draft;
  int64_t k = 0;
  double plain_tok_s = 0, spec_tok_s = 0;
  double acceptance = 0, mean_accepted_length = 0;
  bool lossless = false;  // the ids equal the engine's own plain greedy run's
  double speedup() const { return plain_tok_s > 0 ? spec_tok_s / plain_tok_s : 0; }
};
struct SpecEngineReport {
  std::string engine, command;
  int64_t tokens = 0;
  std::vector<std::string> left_out;  // cells not timed, with why (a draft not offered, a request refused)
  std::vector<SpecEngineRow> rows;
  nlohmann::json to_json() const;
  std::string format() const;
};
// `draft_file`: the trained draft as the engine loads it (empty: the "model" cells are left out).
// Throws checks::EngineUnusable when the engine offers no 'speculate' or no draft "none".
SpecEngineReport run_spec_vs_engine(checks::LoadedEngine& engine, const std::string& command, const std::string& draft_file,
                                    const SpecBenchOptions& opts, const std::function<void(const std::string&)>& progress = {});

}  // namespace tinygpt::tools
