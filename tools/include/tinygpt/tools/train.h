// `tinygpt train`: the series' Part 3 recipe on one corpus, in C++. AdamW (0.9, 0.95), weight
// decay 0.1 on matrices only, lr 1e-3 with linear warm-up over min(200, steps/10) steps then
// cosine decay to 10%, gradient clipping at 1.0, random context-length windows, 90/10 split,
// fixed validation batches, best-validation checkpoint kept, resumable.
// Leaves out dropout: the model library is inference-only (see README).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>

namespace tinygpt::tools {

struct TrainOptions {
  std::string corpus, tokenizer, out_dir;
  int64_t steps = 1500, batch = 16;
  double lr = 1e-3;
  int64_t eval_every = 50, eval_batches = 8;
  uint64_t seed = 1337;
  std::string arch;  // "" = the seed's architecture; "draft" its speculative draft; else a zoo member's (zoo.h)
  double max_minutes = 0;  // 0 = no limit; otherwise stop (and save) after this long
  bool resume = false;
  std::string command;  // recorded in the checkpoint metadata
};

struct TrainSummary {
  int64_t steps_done = 0, best_step = 0;
  double best_val = 0, last_train = 0, seconds = 0;
  int64_t train_tokens = 0, val_tokens = 0;
};

TrainSummary train(const TrainOptions& o, c10::Device device, const std::function<void(const std::string&)>& log);

}  // namespace tinygpt::tools
