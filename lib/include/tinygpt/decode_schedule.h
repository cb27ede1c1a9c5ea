// The bookkeeping of the cached generation loop (SPEC 4), apart from the arithmetic: how a new
// sequence starts (the cache reset), which prompt tokens the prefill feeds (the last `context`),
// the position each decode token is fed at (every token fed so far, never wrapped) and the
// history the token chooser sees (the whole sequence, prompt included). Production behaviour is
// the base class. The harness substitutes other implementations to model loop bugs, so
// generate_cached itself carries no fault branches; the model never sees this class.
#pragma once

#include <ATen/core/Tensor.h>
#include <cstdint>

namespace tinygpt {

class KVCache;

class DecodeSchedule {
 public:
  virtual ~DecodeSchedule() = default;

  // Called once before the prefill of every sequence. Production: cache.reset().
  virtual void begin(KVCache& cache) const;
  // Index of the first prompt token the prefill feeds, for a prompt of `prompt_len` tokens; the
  // prefill feeds min(prompt_len, context) tokens from there at positions 0, 1, ...
  // Production: max(0, prompt_len - context), the last `context` tokens.
  virtual int64_t prefill_start(int64_t prompt_len, int64_t context) const;
  // Position of a decode token when `fed` tokens have been fed before it (prefill included).
  // Production: fed. It keeps growing past the window; RoPE depends on distances only.
  virtual int64_t position(int64_t fed, int64_t context) const;
  // What the token chooser sees: seq (B, L) is the whole sequence so far, the prompt's
  // `prompt_len` tokens first. Production: seq itself.
  virtual at::Tensor history(const at::Tensor& seq, int64_t prompt_len) const;
};

// Production schedule, shared and stateless.
const DecodeSchedule& production_schedule();

}  // namespace tinygpt
