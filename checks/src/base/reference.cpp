#include "tinygpt/checks/reference.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "tinygpt/checks/parallel_runs.h"
#include "tinygpt/checks/results.h"
#include "tinygpt/generate.h"
#include "tinygpt/kv_cache.h"

namespace tinygpt::checks {

at::Tensor main_prompt(c10::Device device) {
  return at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong).unsqueeze(0).to(device);  // (1, 3)
}

double fp32_noise_floor(GPT& model) {
  at::NoGradGuard no_grad;
  const Config& c = model->config();
  const int64_t T = std::min<int64_t>(128, c.context);
  std::vector<int64_t> ids(2 * T);
  uint64_t x = 20261206;
  for (auto& id : ids) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(c.vocab_size));
  }
  const c10::Device dev = model->parameters().front().device();
  const at::Tensor two = at::tensor(ids, at::kLong).view({2, T}).to(dev);  // (2, T)
  const at::Tensor alone = model->forward(two.narrow(0, 0, 1)).to(at::kFloat);  // (1, T, V)
  // Both rows prefilled to T/2 in one cache, then stepped one token at a time, side by side.
  RollingKVCache cache(c);
  double worst = (model->step(two.narrow(1, 0, T / 2), cache, 0).narrow(0, 0, 1).to(at::kFloat) - alone.select(1, T / 2 - 1))
                     .abs().max().item<double>();
  for (int64_t t = T / 2; t < T; ++t) {
    const at::Tensor step = model->step(two.narrow(1, t, 1), cache, t).narrow(0, 0, 1).to(at::kFloat);  // (1, V)
    worst = std::max(worst, (step - alone.select(1, t)).abs().max().item<double>());
  }
  return worst;
}

double top2_margin(const at::Tensor& logits) {
  if (logits.size(-1) < 2) return std::numeric_limits<double>::infinity();
  at::Tensor top2 = std::get<0>(logits.topk(2, -1));
  return (top2.select(-1, 0) - top2.select(-1, 1)).min().item<double>();
}

double flip_kl(const at::Tensor& logits) {
  if (logits.size(-1) < 2) return std::numeric_limits<double>::infinity();
  at::Tensor p = std::get<0>(logits.to(at::kDouble).softmax(-1).topk(2, -1));  // (B, 2)
  at::Tensor p1 = p.select(-1, 0), p2 = p.select(-1, 1), mid = (p1 + p2) / 2;
  return (p1 * (p1 / mid).log() + p2 * (p2 / mid).log()).max().item<double>();
}

double StepDiffs::top1_agreement() const {
  if (top1.empty()) return 1.0;
  return static_cast<double>(std::count(top1.begin(), top1.end(), true)) / static_cast<double>(top1.size());
}

double StepDiffs::kl_mean() const {
  return kl.empty() ? 0.0 : std::accumulate(kl.begin(), kl.end(), 0.0) / static_cast<double>(kl.size());
}

double StepDiffs::kl_max() const { return kl.empty() ? 0.0 : *std::max_element(kl.begin(), kl.end()); }

std::optional<size_t> StepDiffs::first_kl_over(double bound) const {
  for (size_t i = 0; i < kl.size(); ++i)
    if (!(kl[i] <= bound)) return i;
  return std::nullopt;
}

StepDiffs compare_steps(const at::Tensor& got_in, const at::Tensor& ref, int64_t first_position, double tol) {
  StepDiffs d;
  d.first_position = first_position;
  const int64_t m = ref.size(1);
  if (m == 0) return d;
  const at::Tensor got = got_in.narrow(1, 0, m).to(ref.device()).to(at::kFloat);  // (B, m, V)
  at::Tensor diff = (got - ref).abs().amax({0, 2}).to(at::kDouble);              // (m)
  diff = at::where(diff.isnan(), at::full_like(diff, std::numeric_limits<double>::infinity()), diff).cpu().contiguous();
  d.diffs.assign(diff.data_ptr<double>(), diff.data_ptr<double>() + m);
  // KL(reference || got) in double, per row and step; its max over rows per step.
  const at::Tensor lr = ref.to(at::kDouble).log_softmax(-1), lg = got.to(at::kDouble).log_softmax(-1);
  at::Tensor kl = (lr.exp() * (lr - lg)).sum(-1).amax(0);  // (m)
  kl = at::where(kl.isnan(), at::full_like(kl, std::numeric_limits<double>::infinity()), kl).cpu().contiguous();
  d.kl.assign(kl.data_ptr<double>(), kl.data_ptr<double>() + m);
  const at::Tensor same = (got.argmax(-1) == ref.argmax(-1)).all(0).cpu();  // (m)
  d.top1.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    d.top1[i] = same[i].item<bool>();
    if (!d.top1[i] && !d.first_top1_parting) {
      d.first_top1_parting = first_position + i;
      d.margin_at_parting = top2_margin(ref.select(1, i));
    }
    if (d.diffs[i] > d.worst || d.worst_position < 0) d.worst = d.diffs[i], d.worst_position = first_position + i;
    if (!d.first_position_over && d.diffs[i] > tol) d.first_position_over = first_position + i;
  }
  return d;
}

std::string describe_steps(const StepDiffs& d, double tol, const at::Tensor& ref) {
  const std::string tail = "worst |diff| " + sci(d.worst) + " at position " + std::to_string(d.worst_position) + " over " +
                           std::to_string(d.diffs.size()) + " steps";
  if (!d.first_position_over) return tail;
  const int64_t step = *d.first_position_over - d.first_position;
  return "first over " + sci(tol) + " at position " + std::to_string(*d.first_position_over) + " (step " +
         std::to_string(step) + ", |diff| " + sci(d.diffs[step]) + ", top-2 margin there " +
         sci(top2_margin(ref.select(1, step))) + "); " + tail;
}

int64_t steps_before_parting(const at::Tensor& a, const at::Tensor& b, int64_t t0, int64_t n) {
  const at::Tensor same = (a.narrow(1, t0, n) == b.narrow(1, t0, n).to(a.device())).all(0);  // (n)
  const at::Tensor part = same.logical_not().nonzero();
  return part.numel() ? part[0][0].item<int64_t>() : n;
}

StepReference reference_for(GPT& model, const at::Tensor& seq, int64_t prompt_len, int64_t n) {
  at::NoGradGuard no_grad;
  const int64_t ctx = model->config().context;
  const int64_t s0 = std::max<int64_t>(0, prompt_len - ctx), w = prompt_len - s0;
  if (n < 1 || seq.size(1) < prompt_len + n - 1) throw std::invalid_argument("reference_for: sequence too short");
  // What the cached loop sees: the prompt from s0 on. Step i predicts from its first w + i tokens.
  at::Tensor fed = seq.narrow(1, s0, w + n - 1);                         // (B, w + n - 1)
  const int64_t inside = std::max<int64_t>(0, std::min(n, ctx - w + 1));  // steps with w + i <= context
  StepReference r;
  r.full = inside > 0 ? model->forward(fed.narrow(1, 0, w + inside - 1)).narrow(1, w - 1, inside)
                      : at::empty({seq.size(0), 0, model->config().vocab_size}, seq.options().dtype(at::kFloat));
  r.band = model->forward_with(fed, BandedPolicy(ctx + 1)).narrow(1, w - 1, n);  // (B, n, V)
  return r;
}

Reference Reference::prefix(int64_t tokens) const {
  const int64_t n = uncached_logits.size(1), T0 = uncached.size(1) - n;
  if (tokens < 1 || tokens > n) throw std::invalid_argument("Reference::prefix: tokens must be in [1, " + std::to_string(n) + "]");
  Reference r;
  r.uncached = uncached.narrow(1, 0, T0 + tokens);
  r.uncached_logits = uncached_logits.narrow(1, 0, tokens);
  r.uncached_margin = uncached_margin.narrow(0, 0, tokens);
  r.steps.full = steps.full.narrow(1, 0, std::min(tokens, steps.full.size(1)));
  r.steps.band = steps.band.narrow(1, 0, tokens);
  return r;
}

Reference build_reference(GPT& model, const at::Tensor& prompt, int64_t tokens) {
  return build_reference(model, prompt, tokens, at::Tensor(), 1);
}

Reference build_reference(GPT& model, const at::Tensor& prompt, int64_t tokens, const at::Tensor& guess, int workers) {
  GuessedReference g(model, prompt, tokens, workers > 1 ? guess : at::Tensor(), workers);
  run_in_parallel(g.spans(), workers, [&](size_t i) { g.run_span(i); });
  return g.finish();
}

GuessedReference::GuessedReference(GPT& model, const at::Tensor& prompt, int64_t tokens, const at::Tensor& guess, int spans)
    : model_(model), prompt_(prompt), tokens_(tokens) {
  check_token_ids(prompt, model->config().vocab_size, "reference prompt");
  if (tokens < 1) throw std::invalid_argument("reference: tokens must be >= 1");
  const int64_t T0 = prompt.size(1), ctx = model->config().context;
  if (!guess.defined() || spans < 1 || guess.dim() != 2 || guess.size(0) != prompt.size(0) || guess.size(1) != T0 + tokens ||
      !guess.narrow(1, 0, T0).to(prompt.device()).equal(prompt))
    return;
  guess_ = guess.to(prompt.device());
  ahead_.resize(static_cast<size_t>(tokens));
  // Spans of about equal cost: step i's forward is over min(T0 + i, context) tokens.
  auto cost = [&](int64_t i) { return static_cast<double>(std::min(T0 + i, ctx)); };
  double total = 0;
  for (int64_t i = 0; i < tokens; ++i) total += cost(i);
  int64_t from = 0;
  double acc = 0;
  for (int64_t i = 0; i < tokens; ++i) {
    acc += cost(i);
    if (acc >= total * static_cast<double>(spans_.size() + 1) / spans || i == tokens - 1) {
      spans_.emplace_back(from, i + 1);
      from = i + 1;
    }
  }
}

void GuessedReference::run_span(size_t s) {
  at::NoGradGuard no_grad;
  const int64_t T0 = prompt_.size(1), ctx = model_->config().context;
  for (int64_t i = spans_.at(s).first; i < spans_[s].second; ++i) {
    const int64_t L = T0 + i, n = std::min(L, ctx);
    ahead_[static_cast<size_t>(i)] = model_->forward_last(guess_.narrow(1, L - n, n));  // (B, V): generate_uncached's step
  }
}

Reference GuessedReference::finish() {
  at::NoGradGuard no_grad;
  const int64_t T0 = prompt_.size(1);
  Reference ref;
  std::vector<double> margins;
  Recorder keep;
  at::Tensor seq = prompt_;
  int64_t done = 0;  // steps whose choice the guess had right
  for (; done < static_cast<int64_t>(ahead_.size()); ++done) {
    const at::Tensor& l = ahead_[static_cast<size_t>(done)];
    if (!l.defined()) throw std::logic_error("GuessedReference::finish: a span has not run");
    const at::Tensor chosen = greedy()(l, seq).view({-1, 1}).to(seq.device());  // (B, 1)
    margins.push_back(top2_margin(l));
    keep(done, l);
    seq = at::cat({seq, chosen}, 1);
    if (!chosen.equal(guess_.narrow(1, T0 + done, 1))) {
      ++done;
      break;
    }
  }
  if (done < tokens_) {  // the rest one step after another, from where the guess parted (or from the start)
    const at::Tensor rest = generate_uncached(model_, seq, tokens_ - done, greedy(), [&](int64_t i, const at::Tensor& l) {
      margins.push_back(top2_margin(l));
      keep(done + i, l);
    });
    seq = rest;
  }
  ref.uncached = seq;                    // (B, T0 + tokens)
  ref.uncached_logits = keep.stacked();  // (B, tokens, V)
  ref.uncached_margin = at::tensor(margins, at::kDouble);
  ref.steps = reference_for(model_, ref.uncached, T0, tokens_);
  return ref;
}

}  // namespace tinygpt::checks
