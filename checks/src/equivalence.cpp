#include "tinygpt/checks/equivalence.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <limits>
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
}  // namespace

// top1 - top2 of each row, min over rows: (B, V) -> scalar.
double top2_margin(const at::Tensor& logits) {
  if (logits.size(-1) < 2) return std::numeric_limits<double>::infinity();
  at::Tensor top2 = std::get<0>(logits.topk(2, -1));
  return (top2.select(-1, 0) - top2.select(-1, 1)).min().item<double>();
}

// got (B, >= m, V) against ref (B, m, V), step by step.
StepDiffs compare_steps(const at::Tensor& got, const at::Tensor& ref, int64_t first_position, double tol) {
  StepDiffs d;
  d.first_position = first_position;
  const int64_t m = ref.size(1);
  if (m == 0) return d;
  at::Tensor diff = (got.narrow(1, 0, m).to(ref.device()).to(at::kFloat) - ref).abs().amax({0, 2}).to(at::kDouble);
  diff = at::where(diff.isnan(), at::full_like(diff, std::numeric_limits<double>::infinity()), diff).cpu().contiguous();
  d.diffs.assign(diff.data_ptr<double>(), diff.data_ptr<double>() + m);
  for (int64_t i = 0; i < m; ++i) {
    if (d.diffs[i] > d.worst || d.worst_position < 0) d.worst = d.diffs[i], d.worst_position = first_position + i;
    if (!d.first_position_over && d.diffs[i] > tol) d.first_position_over = first_position + i;
  }
  return d;
}

// One line for a comparison; `ref` supplies the top-2 margin at the first step over tolerance.
std::string describe_steps(const StepDiffs& d, double tol, const at::Tensor& ref) {
  const std::string tail = "worst |diff| " + fmt(d.worst) + " at position " + std::to_string(d.worst_position) +
                           " over " + std::to_string(d.diffs.size()) + " steps";
  if (!d.first_position_over) return tail;
  const int64_t step = *d.first_position_over - d.first_position;
  return "first over " + fmt(tol) + " at position " + std::to_string(*d.first_position_over) + " (step " +
         std::to_string(step) + ", |diff| " + fmt(d.diffs[step]) + ", top-2 margin there " +
         fmt(top2_margin(ref.select(1, step))) + "); " + tail;
}

namespace {


// The production loop (generate_cached) with its per-step logits kept: seq (B, T0 + n) and
// logits (B, n, V), the logits each token was chosen from.
struct LoopRun {
  at::Tensor seq, logits;
};
LoopRun run_loop(GPT& model, const at::Tensor& prompt, int64_t n, const TokenChooser& choose, KVCache& cache,
                 const DecodePath& path) {
  std::vector<at::Tensor> steps;
  steps.reserve(static_cast<size_t>(n));
  LoopRun r;
  r.seq = generate_cached(model, prompt, n, choose, cache, path,
                          [&](int64_t, const at::Tensor& l) { steps.push_back(l.clone()); });
  r.logits = at::stack(steps, 1);  // (B, n, V)
  return r;
}

// The harness's own cached loop over a given sequence: SPEC 4's bookkeeping written out here,
// so a fault in the cache or attention shows apart from the production loop's. (B, n, V).
at::Tensor teacher_forced(GPT& model, const at::Tensor& seq, int64_t t0, int64_t n, KVCache& cache,
                          const CacheVariant& variant) {
  at::NoGradGuard no_grad;
  const DecodePath path = variant.path();
  const int64_t ctx = model->config().context, s0 = std::max<int64_t>(0, t0 - ctx), w = t0 - s0;
  cache.reset();
  std::vector<at::Tensor> out;
  out.push_back(model->step(seq.narrow(1, s0, w), cache, 0, *path.policy, path.kernels));
  for (int64_t i = 1; i < n; ++i)  // token t0 + i - 1, the (w + i)th fed, at position w + i - 1
    out.push_back(model->step(seq.narrow(1, t0 + i - 1, 1), cache, w + i - 1, *path.policy, path.kernels));
  return at::stack(out, 1);
}

// Row b = `row` shifted by b ids (mod V): a batch of different prompts of one length.
at::Tensor shifted_rows(const at::Tensor& row, int64_t rows, int64_t vocab) {
  at::Tensor shift = at::arange(rows, row.options()).unsqueeze(1);  // (rows, 1)
  return (row + shift).remainder(vocab);                             // (rows, T0)
}

template <typename F>
SubCheck guarded(const std::string& name, F body) {
  SubCheck c{name, true, "", 0};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    body(c);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    c.passed = false;
    c.detail = "error: " + msg;
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

// Runs the two comparisons of a loop run against its references and fills one sub-check; returns
// the banded one (every step).
StepDiffs judge(SubCheck& c, const at::Tensor& logits, const StepReference& ref, int64_t prompt_len, double tol) {
  const StepDiffs full = compare_steps(logits, ref.full, prompt_len - 1, tol);
  StepDiffs band = compare_steps(logits, ref.band, prompt_len - 1, tol);
  c.passed = !full.first_position_over && !band.first_position_over;
  if (full.first_position_over) c.detail = "vs full forward: " + describe_steps(full, tol, ref.full);
  else c.detail = "vs banded reference: " + describe_steps(band, tol, ref.band);
  return band;
}

// Steps, of the n new tokens after the first t0, before sequences a and b (B, >= t0 + n) part in
// any row: n when they never do.
int64_t steps_before_parting(const at::Tensor& a, const at::Tensor& b, int64_t t0, int64_t n) {
  const at::Tensor same = (a.narrow(1, t0, n) == b.narrow(1, t0, n).to(a.device())).all(0);  // (n)
  const at::Tensor part = same.logical_not().nonzero();
  return part.numel() ? part[0][0].item<int64_t>() : n;
}

}  // namespace

bool EquivalenceResult::passed() const {
  for (const auto& c : checks)
    if (!c.passed) return false;
  return true;
}

const SubCheck* EquivalenceResult::check(const std::string& name) const {
  for (const auto& c : checks)
    if (c.name == name) return &c;
  return nullptr;
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

Reference build_reference(GPT& model, const EquivalenceOptions& opts) {
  const Config& cfg = model->config();
  check_token_ids(opts.prompt, cfg.vocab_size, "equivalence prompt");
  if (opts.tokens < 1) throw std::invalid_argument("equivalence: --tokens must be >= 1");
  for (auto [v, what] : {std::pair{opts.batch_rows, "batch rows"}, {opts.long_tokens, "long-prompt tokens"},
                         {opts.reset_tokens, "reset tokens"}})
    if (v < 1) throw std::invalid_argument(std::string("equivalence: ") + what + " must be >= 1");
  opts.sampling.validate();
  if (opts.sampling.temperature == 0) throw std::invalid_argument("equivalence: the sampled check needs temperature > 0");
  at::NoGradGuard no_grad;
  Reference ref;
  std::vector<double> margins;
  std::vector<at::Tensor> logits;
  ref.uncached = generate_uncached(model, opts.prompt, opts.tokens, greedy(), [&](int64_t, const at::Tensor& l) {
    margins.push_back(top2_margin(l));
    logits.push_back(l.clone());
  });
  ref.uncached_logits = at::stack(logits, 1);  // (B, tokens, V)
  ref.uncached_margin = at::tensor(margins, at::kDouble);
  ref.steps = reference_for(model, ref.uncached, opts.prompt.size(1), opts.tokens);
  return ref;
}

EquivalenceResult check_equivalence(GPT& model, const EquivalenceOptions& opts, const Reference& ref,
                                    const CacheVariant& variant) {
  const Config& cfg = model->config();
  const double tol = kLogitTolerance;
  const int64_t T0 = opts.prompt.size(1), V = cfg.vocab_size, ctx = cfg.context;
  const int64_t past = std::min(opts.tokens, ctx + 32);
  EquivalenceResult r;
  r.cache = variant.name;
  r.prompt_len = T0;
  r.tokens = opts.tokens;
  r.batch = opts.prompt.size(0);
  r.context = ctx;
  r.sequence_length = T0 + opts.tokens;
  r.must_match = std::max<int64_t>(0, std::min(ctx - T0, opts.tokens));
  at::Tensor m = ref.uncached_margin.contiguous();
  r.step_margins.assign(m.data_ptr<double>(), m.data_ptr<double>() + m.numel());
  at::NoGradGuard no_grad;
  const DecodePath path = variant.path();
  // One cache object for every check, as a server holds one: the production loop starts each
  // sequence itself (its schedule resets the cache), which the reset check verifies.
  auto cache = variant.make_cache(cfg);

  // 1-3. The production loop, greedy, on a fresh cache: its tokens against the uncached run, its
  // own logits against the full forward (inside the window) and the banded reference (every step).
  LoopRun main;
  r.checks.push_back(guarded("tokens", [&](SubCheck& c) {
    main = run_loop(model, opts.prompt, opts.tokens, greedy(), *cache, path);
    r.produced = main.seq;
    r.identical_prefix = steps_before_parting(ref.uncached, main.seq, T0, opts.tokens);
    if (r.identical_prefix < opts.tokens) {
      r.first_difference = T0 + r.identical_prefix;
      r.margin_at_difference = ref.uncached_margin[r.identical_prefix].item<double>();
    }
    c.passed = r.identical_prefix >= r.must_match;
    c.detail = "first " + std::to_string(std::min(r.identical_prefix, r.must_match)) + " of " +
               std::to_string(r.must_match) + " in-window tokens identical";
    if (!c.passed)
      c.detail += "; the production loop's token at position " + std::to_string(*r.first_difference) +
                  " differs (uncached top-2 margin there " + fmt(*r.margin_at_difference) + ")";
  }));
  const bool have_main = main.logits.defined();
  StepReference own;
  auto own_reference = [&]() -> const StepReference& {
    if (!own.band.defined())
      own = main.seq.to(ref.uncached.device()).equal(ref.uncached) ? ref.steps : reference_for(model, main.seq, T0, opts.tokens);
    return own;
  };
  r.checks.push_back(guarded("logits", [&](SubCheck& c) {
    if (!have_main) throw std::runtime_error("the production loop did not run (see tokens)");
    const StepReference& s = own_reference();
    r.loop_full = compare_steps(main.logits, s.full, T0 - 1, tol);
    c.passed = !r.loop_full.first_position_over;
    c.detail = "production loop vs full forward, inside the window: " + describe_steps(r.loop_full, tol, s.full);
  }));
  r.checks.push_back(guarded("window-reference", [&](SubCheck& c) {
    if (!have_main) throw std::runtime_error("the production loop did not run (see tokens)");
    const StepReference& s = own_reference();
    r.loop_band = compare_steps(main.logits, s.band, T0 - 1, tol);
    c.passed = !r.loop_band.first_position_over;
    c.detail = "production loop vs banded reference, every step: " + describe_steps(r.loop_band, tol, s.band);
  }));

  // 4. Reset: another sequence on the same cache, then the first prompt again: the same logits.
  r.checks.push_back(guarded("reset", [&](SubCheck& c) {
    if (!have_main) throw std::runtime_error("the production loop did not run (see tokens)");
    const int64_t k = std::min(opts.reset_tokens, opts.tokens);
    run_loop(model, (opts.prompt + 7).remainder(V), k, greedy(), *cache, path);
    LoopRun again = run_loop(model, opts.prompt, k, greedy(), *cache, path);
    const at::Tensor first = main.logits.narrow(1, 0, k);
    const StepDiffs d = compare_steps(again.logits, first, T0 - 1, tol);
    c.passed = !d.first_position_over;
    c.detail = "after another sequence on the same cache: " + describe_steps(d, tol, first);
  }));

  // 5. Teacher-forced: the harness's own loop over the uncached sequence. It isolates the cache
  // and the attention from the production loop's bookkeeping.
  r.checks.push_back(guarded("teacher-forced", [&](SubCheck& c) {
    at::Tensor tf = teacher_forced(model, ref.uncached, T0, opts.tokens, *cache, variant);  // (B, tokens, V)
    r.forced_full = compare_steps(tf, ref.steps.full, T0 - 1, tol);
    r.forced_band = compare_steps(tf, ref.steps.band, T0 - 1, tol);
    c.passed = !r.forced_full.first_position_over && !r.forced_band.first_position_over;
    c.detail = r.forced_full.first_position_over ? "vs full forward: " + describe_steps(r.forced_full, tol, ref.steps.full)
                                                 : "vs banded reference: " + describe_steps(r.forced_band, tol, ref.steps.band);
  }));

  // 6. Sampled: a seeded run with every sampler stage active. Its logits against the references
  // over the sequence it drew; the history the loop hands the sampler against the whole sequence
  // so far (SPEC 4: prompt included); and each draw against the sampler replayed on the reference
  // logits, so a loop bug that only shows when sampling is caught too.
  r.checks.push_back(guarded("sampled", [&](SubCheck& c) {
    const int64_t n = opts.sampled_tokens > 0 ? opts.sampled_tokens : past;
    at::Tensor expect = opts.prompt;  // the sequence so far, as the harness sees it
    std::string history_error;
    // A generator of this check's own: no other thread's draws can interleave with it.
    at::Generator gen = make_generator(opts.prompt.device(), opts.sampling_seed);
    const TokenChooser draw_and_watch = [&](const at::Tensor& logits, const at::Tensor& history) {
      if (history_error.empty() && !(history.sizes() == expect.sizes() && history.equal(expect)))
        history_error = "the sampler was handed a history of " + std::to_string(history.size(1)) + " ids at position " +
                        std::to_string(expect.size(1)) + ", not the whole sequence so far (" +
                        std::to_string(expect.size(1)) + " ids, prompt included; SPEC 4)";
      at::Tensor ids = pick(logits, opts.sampling, history, gen);
      expect = at::cat({expect, ids.unsqueeze(1)}, 1);
      return ids;
    };
    LoopRun run = run_loop(model, opts.prompt, n, draw_and_watch, *cache, path);
    const StepReference s = reference_for(model, run.seq, T0, n);
    judge(c, run.logits, s, T0, tol);
    if (!c.passed) return;
    if (!history_error.empty()) {
      c.passed = false;
      c.detail = history_error;
      return;
    }
    at::Generator replay = make_generator(opts.prompt.device(), opts.sampling_seed);
    at::Tensor seq = run.seq.to(s.band.device());
    for (int64_t i = 0; i < n; ++i) {
      at::Tensor want = pick(s.band.select(1, i), opts.sampling, seq.narrow(1, 0, T0 + i), replay);  // (B)
      if (!want.equal(seq.select(1, T0 + i))) {
        c.passed = false;
        c.detail = "draw at position " + std::to_string(T0 + i) + " differs from the sampler replayed on the reference " +
                   "logits with the whole history (" + opts.sampling.to_string() + ")";
        return;
      }
    }
    c.detail += "; " + std::to_string(n) + " draws equal the replay, with the whole history (" + opts.sampling.to_string() + ")";
  }));

  // 7. Long prompt: longer than the window, so the prefill must take its last `context` tokens
  // and decode positions start past the window.
  r.checks.push_back(guarded("long-prompt", [&](SubCheck& c) {
    at::Generator gen = at::detail::createCPUGenerator(7);
    at::Tensor prompt = at::randint(0, V, {1, ctx + opts.long_extra}, gen, at::kLong).to(opts.prompt.device());
    LoopRun run = run_loop(model, prompt, opts.long_tokens, greedy(), *cache, path);
    judge(c, run.logits, reference_for(model, run.seq, prompt.size(1), opts.long_tokens), prompt.size(1), tol);
    c.detail = std::to_string(prompt.size(1)) + "-token prompt, " + c.detail;
  }));

  // 8. Batch: rows of different prompts in one batch. Each row against its own sequence alone
  // (batch 1) through the uncached forward, full and banded, inside and past the window; each
  // row's ids against the greedy choice on those logits; and row 0 of a one-row prompt against
  // the main run, the same prompt alone through the cache under test.
  r.checks.push_back(guarded("batch", [&](SubCheck& c) {
    const at::Tensor rows = r.batch > 1 ? opts.prompt : shifted_rows(opts.prompt, opts.batch_rows, V);
    const int64_t R = rows.size(0), n = opts.batch_tokens > 0 ? opts.batch_tokens : past;
    LoopRun batched = run_loop(model, rows, n, greedy(), *cache, path);
    double worst = 0;
    for (int64_t b = 0; b < R; ++b) {
      const std::string row = "row " + std::to_string(b) + " of " + std::to_string(R);
      const at::Tensor seq = batched.seq.narrow(0, b, 1);                 // (1, T0 + n)
      const at::Tensor got = batched.logits.narrow(0, b, 1);              // (1, n, V)
      const StepReference alone = reference_for(model, seq.to(ref.uncached.device()), T0, n);
      worst = std::max(worst, judge(c, got, alone, T0, tol).worst);
      if (!c.passed) {
        c.detail = row + " vs its sequence alone, " + c.detail;
        return;
      }
      // Greedy picked each id from logits within tol of the reference's, so the reference may
      // rank another id above it by 2 * tol at most (a near-tie); more is a wrong pick.
      const at::Tensor ids = seq.narrow(1, T0, n).to(alone.band.device()).unsqueeze(-1);  // (1, n, 1)
      const at::Tensor gap = (alone.band.amax(-1, true) - alone.band.gather(-1, ids)).view({n});  // (n)
      const at::Tensor wrong = (gap > 2 * tol).nonzero();
      if (wrong.numel()) {
        const int64_t i = wrong[0][0].item<int64_t>();
        c.passed = false;
        c.detail = row + ": token at position " + std::to_string(T0 + i) + " is not the greedy choice of its own " +
                   "reference logits (" + fmt(gap[i].item<double>()) + " below the top, not a near-tie)";
        return;
      }
    }
    // Row 0 of shifted rows is the prompt itself: the main run is that row alone, on this cache.
    // Compared up to the first step where their ids part (both may pick either side of a near-tie).
    const bool against_main = r.batch == 1 && have_main && n <= opts.tokens;
    if (against_main) {
      const int64_t parts = steps_before_parting(main.seq, batched.seq.narrow(0, 0, 1), T0, n);
      const at::Tensor first = main.logits.narrow(1, 0, std::min(n, parts + 1));
      const StepDiffs d = compare_steps(batched.logits.narrow(0, 0, 1), first, T0 - 1, tol);
      worst = std::max(worst, d.worst);
      if (d.first_position_over) {
        c.passed = false;
        c.detail = "row 0 of " + std::to_string(R) + " vs the same prompt alone on this cache: " + describe_steps(d, tol, first);
        return;
      }
    }
    c.detail = std::to_string(R) + " rows x " + std::to_string(n) + " steps equal each row's sequence alone (worst |diff| " +
               fmt(worst) + ")" + (against_main ? ", row 0 the main run" : "");
  }));
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
    const size_t step = static_cast<size_t>(r.identical_prefix);
    if (step < r.loop_full.diffs.size()) s << "; logit |diff| there " << fmt(r.loop_full.diffs[step]);
    s << "\n";
  } else if (r.produced.defined()) {
    s << "all " << r.sequence_length << " positions identical\n";
  }
  for (const auto& c : r.checks) s << "  " << (c.passed ? "PASS " : "FAIL ") << c.name << ": " << c.detail << "\n";
  s << "tolerance " << fmt(r.tolerance) << ": " << kLogitToleranceReason << "\n";
  return s.str();
}

}  // namespace tinygpt::checks
