#include "tinygpt/generate.h"

#include <ATen/ATen.h>
#include <stdexcept>

namespace tinygpt {

namespace {

// Checks the chooser's answer: ids (B) int64 within the vocabulary. Returns (B, 1).
at::Tensor checked_ids(const at::Tensor& ids, int64_t batch, int64_t vocab) {
  if (!ids.defined() || ids.dim() != 1 || ids.size(0) != batch)
    throw std::runtime_error("token chooser must return a (B) tensor with B=" + std::to_string(batch));
  at::Tensor out = ids.to(at::kLong).unsqueeze(1);
  check_token_ids(out, vocab, "token chooser");
  return out;
}

void check_request(GPT& model, const at::Tensor& idx, int64_t n_tokens) {
  check_token_ids(idx, model->config().vocab_size, "generate");
  if (n_tokens < 0) throw std::invalid_argument("generate: n_tokens must be >= 0");
}

}  // namespace

TokenChooser greedy() {
  return [](const at::Tensor& logits, const at::Tensor&) { return logits.argmax(-1); };
}

at::Tensor generate_uncached(GPT& model, const at::Tensor& idx, int64_t n_tokens,
                             const TokenChooser& choose, const StepObserver& observe) {
  check_request(model, idx, n_tokens);
  at::NoGradGuard no_grad;
  const int64_t ctx = model->config().context, V = model->config().vocab_size;
  at::Tensor seq = idx;  // (B, T)
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t L = seq.size(1), w = std::min(L, ctx);
    at::Tensor logits = model->forward(seq.narrow(1, L - w, w)).select(1, w - 1);  // (B, V)
    if (observe) observe(i, logits);
    seq = at::cat({seq, checked_ids(choose(logits, seq), seq.size(0), V)}, 1);
  }
  return seq;
}

at::Tensor generate_cached(GPT& model, const at::Tensor& idx, int64_t n_tokens,
                           const TokenChooser& choose, KVCache& cache, const AttentionPolicy& policy,
                           const StepObserver& observe) {
  check_request(model, idx, n_tokens);
  at::NoGradGuard no_grad;
  const int64_t ctx = model->config().context, V = model->config().vocab_size;
  cache.reset();
  at::Tensor seq = idx;
  const int64_t L = seq.size(1), w = std::min(L, ctx);
  if (n_tokens == 0) return seq;
  at::Tensor logits = model->step(seq.narrow(1, L - w, w), cache, /*start=*/0, policy);  // (B, V)
  // pos counts every token fed so far and is never wrapped (SPEC 4).
  int64_t pos = w;
  for (int64_t i = 0; i < n_tokens; ++i) {
    if (observe) observe(i, logits);
    at::Tensor next = checked_ids(choose(logits, seq), seq.size(0), V);  // (B, 1)
    seq = at::cat({seq, next}, 1);
    if (i + 1 < n_tokens) logits = model->step(next, cache, pos++, policy);
  }
  return seq;
}

}  // namespace tinygpt
