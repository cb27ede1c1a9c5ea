// The model checks of the check table: a target's logits and tokens against our reference model
// (SPEC 3, 4). Each is one function over the CheckContext; check_table.cpp names them.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include "rows.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/generate.h"

namespace tinygpt::checks {

namespace {

// Steps of the checks that reach just past the window (batch, sampled): context + 32, or fewer when
// the main run is shorter.
int64_t past_window_tokens(const CheckContext& c) {
  return std::min(c.opts.tokens, c.model->config().context + 32);
}

std::string max_diff_bound(double tol) { return "max |diff| <= " + sci(tol); }

// Precision statistics of a comparison, for the report (llama.cpp's perplexity tool reports the
// same for quantised models): top-1 agreement, mean and max KL, the margin where argmaxes part.
void add_stats(CheckResult& r, const StepDiffs& d) {
  r.figure = d.worst;
  r.stats["max_abs_diff"] = d.worst;
  r.stats["top1_agreement"] = d.top1_agreement();
  r.stats["kl_mean"] = d.kl_mean();
  r.stats["kl_max"] = d.kl_max();
  if (d.worst_position >= 0) r.stats["worst_at"] = static_cast<double>(d.worst_position);
  if (d.first_top1_parting) r.stats["margin_at_top1_parting"] = d.margin_at_parting;
  // Where the comparison first went over its bound: what a diagnosis matches faults by (diagnose.h).
  if (d.first_position_over) {
    r.stats["first_over"] = static_cast<double>(*d.first_position_over);
    r.stats["first_over_diff"] = d.diffs.at(static_cast<size_t>(*d.first_position_over - d.first_position));
  } else {
    r.stats.erase("first_over");
    r.stats.erase("first_over_diff");
  }
}

// Judges one comparison by the bounds in force (judge.h: max |diff| by default, mean KL and top-1
// agreement when the user or a deviation set them) and fills the row's statistics: true when within.
bool within(CheckResult& r, const StepDiffs& d, const Tolerances& t, double tol) {
  add_stats(r, d);
  const Verdict v = judge(d, t, tol);
  r.bound = v.bound;
  if (v.by_kl && v.first_over) r.stats["first_kl_over"] = static_cast<double>(d.first_position + static_cast<int64_t>(*v.first_over));
  else r.stats.erase("first_kl_over");
  return v.ok;
}

std::string stats_line(const StepDiffs& d) {
  char b[160];
  std::snprintf(b, sizeof b, "top-1 %.1f%%, KL mean %.1e max %.1e", 100 * d.top1_agreement(), d.kl_mean(), d.kl_max());
  return b;
}

void set(CheckResult& r, bool ok, std::string detail) {
  r.status = ok ? Status::Pass : Status::Fail;
  r.detail = std::move(detail);
}

// describe_steps by the bound that judges the row: judged by the distribution the judge's reason (mean
// KL, where it first went over, top-1) leads, and no |diff| is said to be "over" a bound that did not
// judge it.
std::string described(const StepDiffs& d, const Tolerances& t, const at::Tensor& ref) {
  if (!t.by_distribution()) return describe_steps(d, t.logits, ref);
  const Verdict v = judge(d, t);
  std::string s = v.why.empty() ? "mean KL " + sci(d.kl_mean()) + ", top-1 agreement " + std::to_string(d.top1_agreement()).substr(0, 5)
                                : v.why;
  return s + "; worst |diff| " + sci(d.worst) + " at position " + std::to_string(d.worst_position) + " over " +
         std::to_string(d.diffs.size()) + " steps";
}

}  // namespace

void set_result(CheckResult& r, bool ok, std::string detail) { set(r, ok, std::move(detail)); }

// Runs the two comparisons of a loop run against its references (full inside the window, banded
// every step) and fills `r`; returns the banded one.
StepDiffs judge_row(CheckResult& r, const Tolerances& t, const at::Tensor& logits, const StepReference& ref, int64_t prompt_len) {
  const double tol = t.logits;
  const StepDiffs full = compare_steps(logits, ref.full, prompt_len - 1, tol);
  StepDiffs band = compare_steps(logits, ref.band, prompt_len - 1, tol);
  CheckResult scratch = r;
  const bool full_ok = within(scratch, full, t, tol);
  const bool band_ok = within(r, band, t, tol);
  if (!full_ok) {
    set(r, false, "vs full forward: " + described(full, t, ref.full) + "; " + stats_line(full));
    for (const char* k : {"first_over", "first_over_diff", "worst_at"})
      if (scratch.stats.count(k)) r.stats[k] = scratch.stats[k];
  } else {
    set(r, band_ok, "vs banded reference: " + described(band, t, ref.band) + "; " + stats_line(band));
  }
  return band;
}

StepDiffs judge_positions(CheckResult& r, const Tolerances& t, const at::Tensor& got, const at::Tensor& ref,
                          const std::vector<int64_t>& positions) {
  const StepDiffs d = compare_steps(got, ref, 0, t.logits);
  const bool ok = within(r, d, t, t.logits);
  auto at = [&](int64_t i) { return positions.at(static_cast<size_t>(i)); };
  if (d.worst_position >= 0) r.stats["worst_at"] = static_cast<double>(at(d.worst_position));
  if (r.stats.count("first_kl_over")) r.stats["first_kl_over"] = static_cast<double>(at(static_cast<int64_t>(r.stats["first_kl_over"])));
  if (d.first_position_over) {  // what a diagnosis matches by, whichever bound judged the row
    r.stats["first_over"] = static_cast<double>(at(*d.first_position_over));
    r.stats["first_over_diff"] = d.diffs[static_cast<size_t>(*d.first_position_over)];
  }
  std::string where;
  if (t.by_distribution()) {  // the judge's own reason, its step named by its position in the sequence
    const Verdict v = judge(d, t);
    where = "mean KL " + sci(d.kl_mean()) + ", top-1 agreement " + std::to_string(d.top1_agreement()).substr(0, 5) +
            (v.first_over ? ", first step over the KL bound at position " + std::to_string(at(static_cast<int64_t>(*v.first_over))) +
                                " (KL " + sci(v.at_first_over) + ")"
                          : std::string()) +
            " (" + v.bound + "); worst |diff| " + sci(d.worst);
  } else if (d.first_position_over) {
    const int64_t i = *d.first_position_over;
    where = "first over " + sci(t.logits) + " at position " + std::to_string(at(i)) + " (|diff| " + sci(d.diffs[i]) +
            ", top-2 margin there " + sci(top2_margin(ref.select(1, i))) + ")";
  } else {
    where = "worst |diff| " + sci(d.worst) + (d.worst_position >= 0 ? " at position " + std::to_string(at(d.worst_position)) : "");
  }
  set(r, ok, where + " over " + std::to_string(positions.size()) + " positions; " + stats_line(d));
  return d;
}

// 1. The target's greedy tokens against the uncached run: the first context - T0 must match (SPEC 4).
void tokens_check(CheckContext& c, CheckResult& r) {
  const Generation& main = c.main();
  const Reference& ref = c.ref();
  EquivalenceResult& o = c.out;
  const int64_t T0 = c.opts.prompt.size(1);
  o.produced = main.seq;
  o.identical_prefix = steps_before_parting(ref.uncached, main.seq, T0, c.opts.tokens);
  if (o.identical_prefix < c.opts.tokens) {
    o.first_difference = T0 + o.identical_prefix;
    o.margin_at_difference = ref.uncached_margin[o.identical_prefix].item<double>();
  }
  r.figure = static_cast<double>(std::min(o.identical_prefix, o.must_match));
  r.bound = "the first " + std::to_string(o.must_match) + " new tokens identical";
  const bool identical = o.identical_prefix >= o.must_match;
  // Under a KL budget (an approximate target: a low-precision cache or weights) a parting is the
  // budget's own where the reference's top two there are so close that flipping them costs no more KL
  // than the budget allows each step (docs/checks.md, "A parting under a budget"): the ids go their own
  // way from there, which is what the budget accepted. A parting at a wider margin still fails.
  std::optional<double> flip;
  if (!identical && c.tol().max_kl) flip = flip_kl(ref.uncached_logits.select(1, o.identical_prefix));  // (B, V)
  const bool explained = flip && *flip <= *c.tol().max_kl;
  set(r, identical || explained,
      "first " + std::to_string(std::min(o.identical_prefix, o.must_match)) + " of " + std::to_string(o.must_match) +
          " in-window tokens identical");
  if (identical) return;
  r.detail += "; the target's token at position " + std::to_string(*o.first_difference) +
              " differs (uncached top-2 margin there " + sci(*o.margin_at_difference) + ")";
  if (flip) {
    r.stats["flip_kl_at_parting"] = *flip;
    r.detail += explained ? ": within the KL budget, whose " + sci(*c.tol().max_kl) + " per step can flip a margin that narrow (it takes KL " + sci(*flip) + ")"
                          : ", which takes KL " + sci(*flip) + " to flip: more than the budget's " + sci(*c.tol().max_kl) + " per step explains";
  }
}

// 2. The main run's own logits against the full forward, inside the window.
void logits_check(CheckContext& c, CheckResult& r) {
  const Generation& main = c.main();
  const StepReference& s = c.main_reference();
  const int64_t T0 = c.opts.prompt.size(1);
  c.out.loop_full = compare_steps(main.logits, s.full, T0 - 1, c.tol().logits);
  set(r, within(r, c.out.loop_full, c.tol(), c.tol().logits),
      c.target.loop_name() + " vs full forward, inside the window: " + described(c.out.loop_full, c.tol(), s.full) + "; " +
          stats_line(c.out.loop_full));
}

// 3. Every step, past the window too, against the banded reference.
void window_reference_check(CheckContext& c, CheckResult& r) {
  const Generation& main = c.main();
  const StepReference& s = c.main_reference();
  const int64_t T0 = c.opts.prompt.size(1), inside = c.model->config().context - T0 + 1;
  c.out.loop_band = compare_steps(main.logits, s.band, T0 - 1, c.tol().logits);
  set(r, within(r, c.out.loop_band, c.tol(), c.tol().logits),
      c.target.loop_name() + " vs banded reference, every step: " + described(c.out.loop_band, c.tol(), s.band) + "; " +
          stats_line(c.out.loop_band));
  if (c.opts.tokens <= inside) r.detail += " (never past the window: " + std::to_string(c.opts.tokens) + " tokens)";
}

// 4. Another sequence on the same target, then the first prompt again: the first run's logits.
void reset_check(CheckContext& c, CheckResult& r) {
  const Generation& main = c.main();
  const int64_t V = c.model->config().vocab_size, T0 = c.opts.prompt.size(1);
  const int64_t k = std::min(c.opts.reset_tokens, c.opts.tokens);
  c.target.generate((c.opts.prompt + 7).remainder(V), k, greedy());
  const Generation again = c.target.generate(c.opts.prompt, k, greedy());
  const at::Tensor first = main.logits.narrow(1, 0, k);
  const StepDiffs d = compare_steps(again.logits, first, T0 - 1, c.tol().logits);
  r.figure = d.worst;
  r.bound = max_diff_bound(c.tol().logits);
  set(r, !d.first_position_over, "after another sequence on the same target: " + describe_steps(d, c.tol().logits, first));
}

// 5. The harness's own loop over the uncached sequence: the cache and the attention apart from the
// target's loop bookkeeping.
void teacher_forced_check(CheckContext& c, CheckResult& r) {
  const Reference& ref = c.ref();
  const int64_t T0 = c.opts.prompt.size(1), n = c.opts.tokens;
  const at::Tensor seq = ref.uncached;
  const TokenChooser forced = [&](const at::Tensor& logits, const at::Tensor& history) {
    return seq.select(1, history.size(1)).to(logits.device());  // the reference's next token
  };
  const Generation tf = c.target.drive(c.opts.prompt, n, forced);
  const double tol = c.tol().logits;
  c.out.forced_full = compare_steps(tf.logits, ref.steps.full, T0 - 1, tol);
  c.out.forced_band = compare_steps(tf.logits, ref.steps.band, T0 - 1, tol);
  CheckResult scratch = r;
  const bool full_ok = within(scratch, c.out.forced_full, c.tol(), tol);
  const bool band_ok = within(r, c.out.forced_band, c.tol(), tol);
  if (!full_ok) {
    set(r, false, "vs full forward: " + described(c.out.forced_full, c.tol(), ref.steps.full));
    for (const char* k : {"first_over", "first_over_diff", "worst_at"})
      if (scratch.stats.count(k)) r.stats[k] = scratch.stats[k];
  } else {
    set(r, band_ok, "vs banded reference: " + described(c.out.forced_band, c.tol(), ref.steps.band));
  }
}

// 6. A seeded run with every sampler stage active: its logits against the references over the
// sequence it drew; the history the loop hands the sampler against the whole sequence so far (SPEC 4:
// prompt included); each draw against the sampler replayed on the reference logits.
void sampled_check(CheckContext& c, CheckResult& r) {
  const auto& o = c.opts;
  const int64_t T0 = o.prompt.size(1);
  const int64_t n = o.sampled_tokens > 0 ? o.sampled_tokens : past_window_tokens(c);
  at::Tensor expect = o.prompt;  // the sequence so far, as the harness sees it
  std::string history_error;
  // A generator of this check's own: no other thread's draws can interleave with it.
  at::Generator gen = make_generator(o.prompt.device(), o.sampling_seed);
  const TokenChooser draw_and_watch = [&](const at::Tensor& logits, const at::Tensor& history) {
    if (history_error.empty() && !(history.sizes() == expect.sizes() && history.to(expect.device()).equal(expect)))
      history_error = "the sampler was handed a history of " + std::to_string(history.size(1)) + " ids at position " +
                      std::to_string(expect.size(1)) + ", not the whole sequence so far (" +
                      std::to_string(expect.size(1)) + " ids, prompt included; SPEC 4)";
    at::Tensor ids = pick(logits.to(o.prompt.device()), o.sampling, history.to(o.prompt.device()), gen);
    expect = at::cat({expect, ids.unsqueeze(1)}, 1);
    return ids;
  };
  const Generation run = c.target.generate(o.prompt, n, draw_and_watch);
  const StepReference s = reference_for(c.model, run.seq.to(o.prompt.device()), T0, n);
  judge_row(r, c.tol(), run.logits, s, T0);
  if (!r.ok()) return;
  if (!history_error.empty()) return set(r, false, history_error);
  // Judged by the distribution (an approximate target), a draw may fall either side of a boundary the
  // reference's logits put elsewhere: the draws are replayed only where the logits are held to fp32.
  if (c.tol().by_distribution()) return void(r.detail += "; the history handed to the sampler is the whole sequence so far");
  at::Generator replay = make_generator(o.prompt.device(), o.sampling_seed);
  const at::Tensor seq = run.seq.to(s.band.device());
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor want = pick(s.band.select(1, i), o.sampling, seq.narrow(1, 0, T0 + i), replay);  // (B)
    if (!want.equal(seq.select(1, T0 + i)))
      return set(r, false, "draw at position " + std::to_string(T0 + i) +
                               " differs from the sampler replayed on the reference logits with the whole history (" +
                               o.sampling.to_string() + ")");
  }
  r.detail += "; " + std::to_string(n) + " draws equal the replay, with the whole history (" + o.sampling.to_string() + ")";
}

// 7. A prompt longer than the window: the prefill must take its last `context` tokens and decode
// positions start past the window.
void long_prompt_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Tensor prompt = at::randint(0, V, {1, ctx + c.opts.long_extra}, gen, at::kLong).to(c.opts.prompt.device());
  const Generation run = c.target.generate(prompt, c.opts.long_tokens, greedy());
  judge_row(r, c.tol(), run.logits, reference_for(c.model, run.seq.to(prompt.device()), prompt.size(1), c.opts.long_tokens),
        prompt.size(1));
  r.detail = std::to_string(prompt.size(1)) + "-token prompt, " + r.detail;
  // Positions above are the prompt's own; the engine prefilled its last ctx ids at 0..ctx-1 (SPEC 4),
  // so it numbers every one of them long_extra lower: a user reading its logs needs both.
  const auto over = r.stats.find("first_over");
  if (over != r.stats.end()) {
    const int64_t shift = prompt.size(1) - ctx, at = static_cast<int64_t>(over->second);
    r.stats["first_over_engine"] = static_cast<double>(at - shift);
    r.detail += " (prompt position " + std::to_string(at) + " is the engine's " + std::to_string(at - shift) +
                ": it sees the prompt's last " + std::to_string(ctx) + " ids at 0.." + std::to_string(ctx - 1) + ")";
  }
}

// 8. Rows of different prompts in one batch: each row against its own sequence alone (batch 1)
// through the uncached forward, full and banded, inside and past the window; each row's ids against
// the greedy choice on those logits; and row 0 of a one-row prompt against the main run, the same
// prompt alone through the same target.
void batch_check(CheckContext& c, CheckResult& r) {
  const auto& o = c.opts;
  const int64_t V = c.model->config().vocab_size, T0 = o.prompt.size(1);
  const double tol = c.tol().logits;
  const bool one_row = o.prompt.size(0) == 1;
  const at::Tensor rows = one_row ? shifted_rows(o.prompt, o.batch_rows, V, o.batch_stride) : o.prompt;
  const int64_t R = rows.size(0), n = o.batch_tokens > 0 ? o.batch_tokens : past_window_tokens(c);
  const Generation batched = c.target.generate(rows, n, greedy());
  double worst = 0;
  StepDiffs all;  // the rows' banded comparisons, for the statistics
  for (int64_t b = 0; b < R; ++b) {
    const std::string row = "row " + std::to_string(b) + " of " + std::to_string(R);
    const at::Tensor seq = batched.seq.narrow(0, b, 1).to(o.prompt.device());  // (1, T0 + n)
    const at::Tensor got = batched.logits.narrow(0, b, 1);                      // (1, n, V)
    const StepReference alone = reference_for(c.model, seq, T0, n);
    const StepDiffs band = judge_row(r, c.tol(), got, alone, T0);
    worst = std::max(worst, band.worst);
    if (b == 0 || band.worst > all.worst) all = band;
    if (!r.ok()) return void(r.detail = row + " vs its sequence alone, " + r.detail);
    // Greedy picked each id from logits within tol of the reference's, so the reference may rank
    // another id above it by 2 x tol at most (a near-tie); more is a wrong pick.
    const at::Tensor ids = seq.narrow(1, T0, n).to(alone.band.device()).unsqueeze(-1);           // (1, n, 1)
    const at::Tensor gap = (alone.band.amax(-1, true) - alone.band.gather(-1, ids)).view({n});  // (n)
    const at::Tensor wrong = (gap > 2 * tol).nonzero();
    if (wrong.numel() && !c.tol().by_distribution()) {
      const int64_t i = wrong[0][0].item<int64_t>();
      return set(r, false, row + ": token at position " + std::to_string(T0 + i) + " is not the greedy choice of its own " +
                               "reference logits (" + sci(gap[i].item<double>()) + " below the top, not a near-tie)");
    }
  }
  // Row 0 of shifted rows is the prompt itself: the main run is that row alone, on this target.
  // Compared up to the first step where their ids part (both may pick either side of a near-tie).
  const bool against_main = one_row && c.have_main() && n <= o.tokens;
  if (against_main) {
    const Generation& main = c.main();
    const int64_t parts = steps_before_parting(main.seq, batched.seq.narrow(0, 0, 1), T0, n);
    const at::Tensor first = main.logits.narrow(1, 0, std::min(n, parts + 1));
    const StepDiffs d = compare_steps(batched.logits.narrow(0, 0, 1), first, T0 - 1, tol);
    worst = std::max(worst, d.worst);
    if (const Verdict v = judge(d, c.tol()); !v.ok)
      return set(r, false, "row 0 of " + std::to_string(R) + " vs the same prompt alone on this target: " +
                               (c.tol().by_distribution() ? v.why : describe_steps(d, tol, first)));
  }
  add_stats(r, all);
  r.figure = worst;
  set(r, true, std::to_string(R) + " rows x " + std::to_string(n) + " steps equal each row's sequence alone (worst |diff| " +
                   sci(worst) + ")" + (against_main ? ", row 0 the main run" : ""));
}

// Cached logits of `run` (B, n, V) at the chosen steps against the target's own prefill of the same
// tokens: reset, prefill(seq[:, :T0 + i]). Returns the comparison, steps in order of `steps`.
namespace {
struct SelfDiffs {
  std::vector<int64_t> positions;  // the sequence position each compared step predicts from
  std::vector<double> diffs;
  double worst = 0;
  int64_t worst_position = -1;
  std::optional<int64_t> first_over;
  double margin_at_first_over = 0;
};
void against_own_prefill(DecodeTarget& t, const Generation& run, int64_t T0, const std::vector<int64_t>& steps, double tol,
                         SelfDiffs& out) {
  for (int64_t i : steps) {
    t.reset();
    const at::Tensor own = t.prefill(run.seq.narrow(1, 0, T0 + i));                   // (B, V)
    const at::Tensor cached = run.logits.select(1, i).to(own.device()).to(at::kFloat);  // (B, V)
    double d = (cached - own.to(at::kFloat)).abs().max().item<double>();
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    const int64_t pos = T0 - 1 + i;
    out.positions.push_back(pos);
    out.diffs.push_back(d);
    if (d > out.worst || out.worst_position < 0) out.worst = d, out.worst_position = pos;
    if (d > tol && !out.first_over) {
      out.first_over = pos;
      out.margin_at_first_over = top2_margin(own);
    }
  }
}

}  // namespace

SelfSteps self_steps(int64_t inside, int64_t stride, const at::Tensor& margins) {
  SelfSteps out;
  std::set<int64_t> s;
  if (stride >= 1) {
    for (int64_t i = 1; i < inside; i += stride) s.insert(i);
    out.how = stride == 1 ? "every step" : "every " + std::to_string(stride) + "th step and the last";
  } else {
    for (int64_t i = 1; i < inside; ++i)
      if (i <= kSelfFirstSteps || i % kSelfSpread == 0) s.insert(i);
    // The steps where the run was closest to a tie: where a cache's small error first changes a token.
    std::vector<std::pair<float, int64_t>> by_margin;
    for (int64_t i = 1; i < inside; ++i) by_margin.push_back({margins[i].item<float>(), i});
    std::sort(by_margin.begin(), by_margin.end());
    int64_t added = 0;
    for (const auto& [m, i] : by_margin) {
      if (added == kSelfTightest) break;
      if (s.insert(i).second) ++added;
    }
    out.how = "the first " + std::to_string(kSelfFirstSteps) + ", every " + std::to_string(kSelfSpread) + "th, the " +
              std::to_string(kSelfTightest) + " more of smallest top-2 margin, the last";
  }
  if (inside > 1) s.insert(inside - 1);
  out.steps.assign(s.begin(), s.end());
  return out;
}

// 9. The target against itself: each cached step inside the window against the target's own prefill
// of the same tokens, on the main greedy run and on a batch of different prompts. Every approximation
// the target makes (a GELU formula, an angle recurrence) is in both paths, so only the cache can
// part them: a tight bound holds for an engine that is not bit-exact with our model.
void self_check(CheckContext& c, CheckResult& r) {
  const auto& o = c.opts;
  const int64_t ctx = c.target.context(), T0 = o.prompt.size(1), V = c.model->config().vocab_size;
  const double tol = c.tol().self;
  r.bound = "max |diff| <= " + sci(tol) + " against the target's own prefill";
  if (T0 >= ctx) {
    r.status = Status::Skipped;
    r.detail = "skipped: the prompt fills the window, so no decode step has a prefill twin";
    return;
  }
  const int64_t inside = std::min(o.tokens, ctx - T0 + 1);  // steps whose sequence still fits one prefill
  if (inside < 2) {
    r.status = Status::Skipped;
    r.detail = "skipped: fewer than two steps inside the window";
    return;
  }
  const Generation& main = c.main();
  const at::Tensor lg = main.logits.narrow(1, 0, inside).to(at::kCPU).to(at::kFloat);  // (B, inside, V)
  const at::Tensor top2 = std::get<0>(lg.topk(2, -1));                                 // (B, inside, 2)
  const at::Tensor margins = (top2.select(-1, 0) - top2.select(-1, 1)).amin(0);       // (inside)
  const SelfSteps chosen = self_steps(inside, o.self_stride, margins);
  const std::vector<int64_t>& steps = chosen.steps;
  SelfDiffs d;
  against_own_prefill(c.target, main, T0, steps, tol, d);
  const at::Tensor rows = o.prompt.size(0) == 1 ? shifted_rows(o.prompt, o.batch_rows, V, o.batch_stride) : o.prompt;
  SelfDiffs b;  // an engine that keeps one sequence has no batch of its own
  if (rows.size(0) > 1 && c.target.offers().takes(rows.size(0))) {
    const Generation batched = c.target.generate(rows, inside, greedy());
    against_own_prefill(c.target, batched, T0, steps, tol, b);
  }
  r.figure = std::max(d.worst, b.worst);
  r.stats["max_abs_diff"] = *r.figure;
  const std::string batch = rows.size(0) < 2 ? std::string()
                            : !b.positions.empty() ? " and a batch of " + std::to_string(rows.size(0))
                                      : " only: the target takes " + std::to_string(c.target.offers().max_rows.value_or(1)) + " row(s) at once";
  const std::string what = std::to_string(steps.size()) + " of " + std::to_string(inside - 1) + " cached steps inside the window (" +
                           chosen.how + "; main run" + batch + ")";
  r.stats["steps_compared"] = static_cast<double>(steps.size());
  const SelfDiffs& bad = d.first_over ? d : b;
  if (bad.first_over)
    return set(r, false, "cached step vs the target's own prefill of the same tokens: first over " + sci(tol) + " at position " +
                             std::to_string(*bad.first_over) + (&bad == &b ? " in the batch" : "") + " (top-2 margin there " +
                             sci(bad.margin_at_first_over) + "); worst |diff| " + sci(*r.figure) + " over " + what);
  set(r, true, what + " equal the target's own prefill, worst |diff| " + sci(*r.figure) +
                   "; past the window the rolling semantics have no prefill twin, so it compares inside only");
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

CheckDef tokens_def() {
  return {check::kTokens, "the first context - prompt_len greedy tokens equal the uncached run's (the seed's \"first tokens identical\")", tokens_check,
  kDefaultRow, Judge::Tokens, {}, Cost::Shared,
  "any of the first context - prompt_len new tokens differing; names the position and the reference's top-2 margin there"};
}

CheckDef logits_def() {
  return {check::kLogits, "every step's logits inside the window equal the full forward's, within the tolerance", logits_check,
  kDefaultRow | Tag::Budget, Judge::Reference, {}, Cost::Shared, "|diff| over the tolerance at any step inside the window"};
}

CheckDef window_reference_def() {
  return {check::kWindowReference,
  "every step's logits, past the window too, equal the banded (rolling-cache) reference's (query i sees keys "
  "i-context..i)",
  window_reference_check, kPastRow | Tag::OnlyPastWindow | Tag::Budget, Judge::Reference, {}, Cost::Shared,
  "past-window bugs: a cache trimmed early or never, wrapped or clamped positions"};
}

CheckDef reset_def() {
  return {check::kReset, "after another sequence, the first prompt gives the first run's logits again", reset_check, kDefaultRow,
  Judge::Repeat, {}, Cost::Run, "a cache or loop that does not start fresh"};
}

CheckDef teacher_forced_def() {
  return {check::kTeacherForced,
  "the harness's own loop (reset, prefill, step) over the reference sequence matches both references: the cache alone",
  teacher_forced_check, kPastRow | Tag::Budget, Judge::Reference, {}, Cost::Run, "a cache bug, apart from the target's own loop bookkeeping"};
}

CheckDef sampled_def() {
  return {check::kSampled,
  "a seeded run with every sampler stage on matches the references, hands the sampler the whole history, and "
  "draws what the sampler draws on the reference logits",
  sampled_check, kPastRow, Judge::Reference, {}, Cost::Run,
  "loop bugs that show only when sampling: the history the penalty sees"};
}

CheckDef long_prompt_def() {
  return {check::kLongPrompt,
  "a prompt longer than the window (context + " + std::to_string(EquivalenceOptions{}.long_extra) + " ids) is prefilled from its last context tokens; later steps match",
  long_prompt_check, kPastRow | Tag::OnlyPastWindow, Judge::Reference, {}, Cost::Run,
  "a prefill from the wrong offset, positions past the window"};
}

CheckDef batch_def() {
  return {check::kBatch,
  "different prompts in one batch: each row equals its sequence alone (unbatched, uncached), inside and past the "
  "window, its ids the greedy choice of those logits, the first row the main run",
  batch_check, kPastRow | Tag::Budget, Judge::Reference, {}, Cost::Run, "rows mixed or shifted in the cache, a row handed another row's token", 3};
}

// Our own caches: `logits` already compares every cached step with the full forward, which is our
// prefill; `self` is for targets that are not our model (conform).
CheckDef self_def() {
  return {check::kSelf,
  "each cached step inside the window equals the target's own prefill of the same tokens (the target's "
  "approximations cancel; only its cache can part them)",
  self_check, static_cast<Tags>(Tag::EngineOnly), Judge::Self, {}, Cost::Runs,
  "a cache bug in an engine that is not bit-exact with our model; a bug both paths share passes it"};
}

}  // namespace tinygpt::checks
