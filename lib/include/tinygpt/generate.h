// The two generation loops of SPEC 3 and 4: uncached (the reference) and cached.
// The token chooser is a callback so greedy, the sampler and test doubles plug in alike; the
// cached loop's decisions (attention policy, loop bookkeeping, product kernel) are a DecodePath,
// so a harness can swap any one of them without touching the loop.
#pragma once

#include <ATen/core/Tensor.h>
#include <cstdint>
#include <functional>
#include <vector>

#include "tinygpt/attention_policy.h"
#include "tinygpt/decode_step.h"
#include "tinygpt/decode_schedule.h"
#include "tinygpt/gpt.h"
#include "tinygpt/kv_cache.h"
#include "tinygpt/kernels.h"

namespace tinygpt {

// (logits (B, V), history (B, T) = the whole sequence so far) -> next ids (B) int64.
using TokenChooser = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& history)>;

// Argmax, first index on ties.
TokenChooser greedy();

// Called with each step's logits (B, V) before its token is chosen, `step` counting new tokens
// from 0; may be empty. The tensor is only valid during the call: clone it to keep it.
using StepObserver = std::function<void(int64_t step, const at::Tensor& logits)>;

// The one recording observer: keeps a copy of every step's logits.
class Recorder {
 public:
  void operator()(int64_t step, const at::Tensor& logits);
  // An observer that records into this recorder (which must outlive the loop).
  StepObserver observer();
  // (B, n, V): the steps recorded so far, stacked on dim 1.
  at::Tensor stacked() const;
  const std::vector<at::Tensor>& steps() const { return steps_; }

 private:
  std::vector<at::Tensor> steps_;
};

// How the cached loop runs. Every member has the production default.
struct DecodePath {
  const AttentionPolicy* policy = &production_policy();
  const DecodeSchedule* schedule = &production_schedule();
  Kernels kernels = Kernels::Library;
  StepFunction* step = nullptr;  // a fast variant of the step (decode_step.h); null: the model's own
};

// Runs the full model over the last `context` tokens for every new token.
// idx (B, T0) int64 -> (B, T0 + n_tokens).
at::Tensor generate_uncached(GPT& model, const at::Tensor& idx, int64_t n_tokens,
                             const TokenChooser& choose, const StepObserver& observe = {});

// Prefill with the last `context` tokens, then one-token decode steps at growing positions.
// Starts a new sequence (resets the cache) first. idx (B, T0) int64 -> (B, T0 + n_tokens).
// With `stop` ids, the loop ends early once every row has chosen one of them: (B, T0 + m), m <= n_tokens,
// where a row that stopped first went on choosing (cut it at its first stop id).
at::Tensor generate_cached(GPT& model, const at::Tensor& idx, int64_t n_tokens,
                           const TokenChooser& choose, KVCache& cache, const DecodePath& path = {},
                           const StepObserver& observe = {}, const std::vector<int64_t>& stop = {});

}  // namespace tinygpt
