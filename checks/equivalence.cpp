#include "equivalence.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "tinygpt/generate.h"

namespace tinygpt::checks {

namespace {

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

// top1 - top2 of each row, min over rows: (B, V) -> scalar.
double margin(const at::Tensor& logits) {
  at::Tensor top2 = std::get<0>(logits.topk(2, -1));
  return (top2.select(1, 0) - top2.select(1, 1)).min().item<double>();
}

// Teacher-forced cached logits for predicting seq[:, p+1] at every p in [T0-1, L-2]:
// (B, L - T0, V). The cache is used as a server would: reset, prefill, one token per step.
at::Tensor teacher_forced(GPT& model, const at::Tensor& seq, int64_t t0, KVCache& cache,
                          const AttentionPolicy& policy) {
  at::NoGradGuard no_grad;
  cache.reset();
  std::vector<at::Tensor> out;
  out.push_back(model->step(seq.narrow(1, 0, t0), cache, 0, policy));
  for (int64_t p = t0; p < seq.size(1) - 1; ++p) out.push_back(model->step(seq.narrow(1, p, 1), cache, p, policy));
  return at::stack(out, 1);
}

}  // namespace

bool EquivalenceResult::passed() const {
  for (const auto& c : checks)
    if (!c.passed) return false;
  return true;
}

Reference build_reference(GPT& model, const EquivalenceOptions& opts) {
  const Config& cfg = model->config();
  check_token_ids(opts.prompt, cfg.vocab_size, "equivalence prompt");
  if (opts.prompt.size(1) > cfg.context)
    throw std::invalid_argument("equivalence: the prompt (" + std::to_string(opts.prompt.size(1)) +
                                " ids) must fit the context (" + std::to_string(cfg.context) + ")");
  if (opts.tokens < 1) throw std::invalid_argument("equivalence: --tokens must be >= 1");
  at::NoGradGuard no_grad;
  Reference ref;
  std::vector<double> margins;
  ref.uncached = generate_uncached(model, opts.prompt, opts.tokens, greedy(),
                                   [&](int64_t, const at::Tensor& l) { margins.push_back(margin(l)); });
  ref.uncached_margin = at::tensor(margins, at::kDouble);
  const int64_t L = ref.uncached.size(1);
  ref.window_logits = model->forward(ref.uncached.narrow(1, 0, std::min(L - 1, cfg.context)));
  ref.band_logits = model->forward_with(ref.uncached.narrow(1, 0, L - 1), BandedPolicy(cfg.context + 1));
  return ref;
}

at::Tensor cached_greedy(GPT& model, const at::Tensor& prompt, int64_t tokens, const CacheVariant& variant) {
  auto cache = variant.make_cache(model->config());
  return generate_cached(model, prompt, tokens, greedy(), *cache, *variant.policy);
}

EquivalenceResult check_equivalence(GPT& model, const EquivalenceOptions& opts, const Reference& ref,
                                    const CacheVariant& variant) {
  const Config& cfg = model->config();
  EquivalenceResult r;
  r.cache = variant.name;
  r.prompt_len = opts.prompt.size(1);
  r.tokens = opts.tokens;
  r.batch = opts.prompt.size(0);
  r.context = cfg.context;
  r.sequence_length = r.prompt_len + r.tokens;
  r.must_match = std::max<int64_t>(0, std::min(cfg.context - r.prompt_len, r.tokens));
  at::Tensor m = ref.uncached_margin.contiguous();
  r.step_margins.assign(m.data_ptr<double>(), m.data_ptr<double>() + m.numel());
  at::NoGradGuard no_grad;
  // One cache object for every sub-check, reset between uses, as a server would hold it.
  auto cache = variant.make_cache(cfg);
  const AttentionPolicy& policy = *variant.policy;

  SubCheck tokens{"tokens", true, ""};
  try {
    at::Tensor got = generate_cached(model, opts.prompt, opts.tokens, greedy(), *cache, policy);
    at::Tensor same = (got == ref.uncached).all(0).narrow(0, r.prompt_len, r.tokens);  // (tokens)
    at::Tensor diff = same.logical_not().nonzero();
    r.identical_prefix = diff.numel() ? diff[0][0].item<int64_t>() : r.tokens;
    if (diff.numel()) {
      r.first_difference = r.prompt_len + r.identical_prefix;
      r.margin_at_difference = ref.uncached_margin[r.identical_prefix].item<double>();
    }
    tokens.passed = r.identical_prefix >= r.must_match;
    tokens.detail = "first " + std::to_string(std::min(r.identical_prefix, r.must_match)) + " of " +
                    std::to_string(r.must_match) + " in-window tokens identical";
  } catch (const std::exception& e) {
    tokens.passed = false;
    tokens.detail = std::string("error: ") + e.what();
  }
  r.checks.push_back(tokens);

  SubCheck logits{"logits", true, ""}, band{"window-reference", true, ""};
  try {
    at::Tensor tf = teacher_forced(model, ref.uncached, r.prompt_len, *cache, policy);  // (B, tokens, V)
    // Positions t0-1 .. L-2; inside the window are those < context.
    const int64_t inside = std::min<int64_t>(r.tokens, cfg.context - r.prompt_len + 1);
    at::Tensor wdiff = (tf.narrow(1, 0, inside) - ref.window_logits.narrow(1, r.prompt_len - 1, inside))
                           .abs().amax({0, 2});  // (inside)
    at::Tensor wd = wdiff.to(at::kDouble).contiguous();
    r.window_diffs.assign(wd.data_ptr<double>(), wd.data_ptr<double>() + wd.numel());
    r.worst_window_position = r.prompt_len - 1 + wdiff.argmax().item<int64_t>();
    r.worst_window_diff = wdiff.max().item<double>();
    at::Tensor over = (wdiff > r.tolerance).nonzero();
    if (over.numel()) r.first_window_step_over = r.prompt_len - 1 + over[0][0].item<int64_t>();
    logits.passed = !r.first_window_step_over;
    logits.detail = "worst |diff| " + fmt(r.worst_window_diff) + " at position " +
                    std::to_string(r.worst_window_position) + " over " + std::to_string(inside) + " steps";

    at::Tensor bdiff = (tf - ref.band_logits.narrow(1, r.prompt_len - 1, r.tokens)).abs().amax({0, 2});
    r.worst_band_position = r.prompt_len - 1 + bdiff.argmax().item<int64_t>();
    r.worst_band_diff = bdiff.max().item<double>();
    over = (bdiff > r.tolerance).nonzero();
    if (over.numel()) r.first_band_step_over = r.prompt_len - 1 + over[0][0].item<int64_t>();
    band.passed = !r.first_band_step_over;
    band.detail = "worst |diff| " + fmt(r.worst_band_diff) + " at position " + std::to_string(r.worst_band_position) +
                  " over " + std::to_string(r.tokens) + " steps";
  } catch (const std::exception& e) {
    logits.passed = band.passed = false;
    logits.detail = band.detail = std::string("error: ") + e.what();
  }
  r.checks.push_back(logits);
  r.checks.push_back(band);

  SubCheck batch{"batch", true, ""};
  if (r.batch > 1) {
    try {
      at::Tensor batched = generate_cached(model, opts.prompt, opts.tokens, greedy(), *cache, policy);
      for (int64_t b = 0; b < r.batch && batch.passed; ++b) {
        at::Tensor alone = generate_cached(model, opts.prompt.narrow(0, b, 1), opts.tokens, greedy(), *cache, policy);
        if (!alone.equal(batched.narrow(0, b, 1))) {
          batch.passed = false;
          batch.detail = "row " + std::to_string(b) + " differs from the same prompt run alone";
        }
      }
      if (batch.passed) batch.detail = std::to_string(r.batch) + " rows equal their runs alone";
    } catch (const std::exception& e) {
      batch.passed = false;
      batch.detail = std::string("error: ") + e.what();
    }
  } else {
    batch.detail = "n/a (batch 1)";
  }
  r.checks.push_back(batch);
  return r;
}

std::string format_equivalence(const EquivalenceResult& r) {
  std::ostringstream s;
  if (r.identical_prefix >= r.must_match)
    s << "first " << r.must_match << " tokens identical with and without the cache\n";
  else
    s << "only the first " << r.identical_prefix << " of " << r.must_match
      << " in-window tokens identical with and without the cache: step " << r.identical_prefix
      << " differs inside the window\n";
  if (r.first_difference) {
    s << "first difference at position " << *r.first_difference << " of " << r.sequence_length;
    if (*r.first_difference >= r.context)
      s << " (past the " << r.context << "-token window: expected, the rolling cache keeps entries computed while "
        << "evicted tokens were visible; SPEC 4)";
    if (r.margin_at_difference) s << "; top-2 margin there " << fmt(*r.margin_at_difference);
    if (r.identical_prefix < static_cast<int64_t>(r.window_diffs.size()))
      s << "; logit |diff| there " << fmt(r.window_diffs[r.identical_prefix]);
    s << "\n";
  } else {
    s << "all " << r.sequence_length << " positions identical\n";
  }
  for (const auto& c : r.checks)
    s << "  " << (c.passed ? "PASS " : "FAIL ") << c.name << ": " << c.detail << "\n";
  if (r.first_window_step_over) {
    const size_t step = static_cast<size_t>(*r.first_window_step_over - (r.prompt_len - 1));
    s << "  logits over tolerance " << fmt(r.tolerance) << " first at position " << *r.first_window_step_over;
    if (step < r.window_diffs.size()) s << " (step " << step << ", |diff| " << fmt(r.window_diffs[step]);
    if (step < r.step_margins.size()) s << ", top-2 margin there " << fmt(r.step_margins[step]);
    if (step < r.window_diffs.size()) s << ")";
    s << "\n";
  }
  if (r.first_band_step_over)
    s << "  window reference over tolerance first at position " << *r.first_band_step_over << "\n";
  s << "tolerance " << fmt(r.tolerance) << ": " << kLogitToleranceReason << "\n";
  return s.str();
}

}  // namespace tinygpt::checks
