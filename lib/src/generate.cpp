#include "tinygpt/generate.h"

#include "tinygpt/kernel_step.h"

#include <ATen/ATen.h>
#include <stdexcept>

namespace tinygpt {

namespace {

// Checks the chooser's answer: ids (B) within the vocabulary. Returns (B, 1) int64.
at::Tensor checked_ids(const at::Tensor& ids, int64_t batch, int64_t vocab) {
  if (!ids.defined() || ids.dim() != 1 || ids.size(0) != batch)
    throw std::runtime_error("token chooser must return a (B) tensor with B=" + std::to_string(batch));
  at::Tensor out = ids.to(at::kLong).unsqueeze(1);
  check_token_ids(out, vocab, "token chooser");
  return out;
}

// The chooser's ids as the next step's input (B, 1). On the CPU they are checked at once. On a GPU
// a check would wait for the device every step, so ids out of range are clamped for feeding and
// remembered in `bad` (on the device); the loop throws once at the end when any was.
at::Tensor next_ids(const at::Tensor& ids, int64_t batch, int64_t vocab, at::Tensor& bad) {
  if (!ids.defined() || ids.dim() != 1 || ids.size(0) != batch)
    throw std::runtime_error("token chooser must return a (B) tensor with B=" + std::to_string(batch));
  if (!ids.is_cuda()) return checked_ids(ids, batch, vocab);
  at::Tensor out = ids.to(at::kLong).unsqueeze(1);  // (B, 1)
  at::Tensor wrong = (out < 0).logical_or(out >= vocab).any();
  bad = bad.defined() ? bad.logical_or(wrong) : wrong;
  return out.clamp(0, vocab - 1);
}

void throw_if_bad(const at::Tensor& bad, int64_t vocab) {
  if (bad.defined() && bad.item<bool>())
    throw std::invalid_argument("token chooser: returned an id outside [0, " + std::to_string(vocab) + ")");
}

void check_request(GPT& model, const at::Tensor& idx, int64_t n_tokens) {
  check_token_ids(idx, model->config().vocab_size, "generate");
  if (n_tokens < 0) throw std::invalid_argument("generate: n_tokens must be >= 0");
}

// The output sequence, written in place: (B, T0 + n) with the prompt copied in.
at::Tensor sequence_buffer(const at::Tensor& idx, int64_t n_tokens) {
  at::Tensor seq = at::empty({idx.size(0), idx.size(1) + n_tokens}, idx.options());
  seq.narrow(1, 0, idx.size(1)).copy_(idx);
  return seq;
}

}  // namespace

void Recorder::operator()(int64_t, const at::Tensor& logits) { steps_.push_back(logits.clone()); }

StepObserver Recorder::observer() {
  return [this](int64_t step, const at::Tensor& logits) { (*this)(step, logits); };
}

at::Tensor Recorder::stacked() const {
  if (steps_.empty()) throw std::logic_error("Recorder: no steps recorded");
  return at::stack(steps_, 1);  // (B, n, V)
}

at::Tensor decode_step(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, const DecodePath& path) {
  if (path.step) return (*path.step)(model, idx, cache, start, path.kernels);
  return step_with(model, idx, cache, start, *path.policy, path.kernels);
}

TokenChooser greedy() {
  return [](const at::Tensor& logits, const at::Tensor&) { return logits.argmax(-1); };
}

at::Tensor generate_uncached(GPT& model, const at::Tensor& idx, int64_t n_tokens,
                             const TokenChooser& choose, const StepObserver& observe) {
  check_request(model, idx, n_tokens);
  at::NoGradGuard no_grad;
  const int64_t ctx = model->config().context, V = model->config().vocab_size, T0 = idx.size(1);
  at::Tensor seq = sequence_buffer(idx, n_tokens);  // (B, T0 + n)
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t L = T0 + i, w = std::min(L, ctx);
    at::Tensor logits = model->forward_last(seq.narrow(1, L - w, w));  // (B, V): forward's last position
    if (observe) observe(i, logits);
    seq.narrow(1, L, 1).copy_(checked_ids(choose(logits, seq.narrow(1, 0, L)), seq.size(0), V));
  }
  return seq;
}

at::Tensor generate_cached(GPT& model, const at::Tensor& idx, int64_t n_tokens, const TokenChooser& choose,
                           KVCache& cache, const DecodePath& path, const StepObserver& observe,
                           const std::vector<int64_t>& stop) {
  check_request(model, idx, n_tokens);
  if (n_tokens == 0) return idx;
  at::NoGradGuard no_grad;
  const DecodeSchedule& schedule = *path.schedule;
  const int64_t ctx = model->config().context, V = model->config().vocab_size, T0 = idx.size(1);
  const int64_t w = std::min(T0, ctx);
  const int64_t s0 = schedule.prefill_start(T0, ctx);
  if (s0 < 0 || s0 + w > T0)
    throw std::logic_error("decode schedule: prefill start " + std::to_string(s0) + " leaves no " + std::to_string(w) +
                           "-token window in a " + std::to_string(T0) + "-token prompt");
  at::Tensor seq = sequence_buffer(idx, n_tokens);  // (B, T0 + n)
  schedule.begin(cache);
  at::Tensor logits = decode_step(*model, idx.narrow(1, s0, w), cache, /*start=*/0, path);  // (B, V)
  int64_t fed = w;  // tokens fed so far: the decode position, never wrapped (SPEC 4)
  at::Tensor bad;   // on a GPU: whether the chooser ever returned an id out of range
  const at::Tensor stops = at::tensor(stop, at::kLong).to(idx.device());  // (S,)
  at::Tensor ended = at::zeros({seq.size(0)}, idx.options().dtype(at::kBool));  // (B,): a stop id chosen
  for (int64_t i = 0; i < n_tokens; ++i) {
    if (observe) observe(i, logits);
    const int64_t L = T0 + i;
    at::Tensor next = next_ids(choose(logits, schedule.history(seq.narrow(1, 0, L), T0)), seq.size(0), V, bad);  // (B, 1)
    seq.narrow(1, L, 1).copy_(next);
    if (!stop.empty()) {
      ended = ended | next.view({-1, 1}).eq(stops.view({1, -1})).any(1);
      if (ended.all().item<bool>()) {
        throw_if_bad(bad, V);
        return seq.narrow(1, 0, L + 1);
      }
    }
    if (i + 1 < n_tokens) logits = decode_step(*model, next, cache, schedule.position(fed++, ctx), path);
  }
  throw_if_bad(bad, V);
  return seq;
}

}  // namespace tinygpt
