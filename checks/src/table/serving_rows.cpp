// The serving rows of the check table: what serving engines do to a KV cache - ragged batches,
// rows joining and leaving, fork, rollback - each row judged against our reference model run on
// that row's own sequence alone, inside and past the window (SPEC 4). And batch sizes 1-8, 15-17 and 31-33: every
// row within the tolerance of itself alone, with how far from bitwise identical it is, measured.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>

#include "rows.h"

namespace tinygpt::checks {

std::vector<int64_t> serving_prompt(int64_t len, int64_t b, int64_t vocab) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back((1 + 7 * i + 131 * b) % vocab);
  return p;
}

int64_t held_out(const CheckContext& c) { return static_cast<int64_t>(c.opts.variation % 1000003); }

std::vector<int64_t> row_ids(const CheckContext& c, int64_t len, int64_t b) {
  return serving_prompt(len, b + 16 * held_out(c), c.model->config().vocab_size);
}

std::vector<int64_t> row_prompt(const CheckContext& c, int64_t len, int64_t b) {
  const int64_t n = held_out(c);
  return row_ids(c, n == 0 ? len : len + (5 * n + b) % 7, b);
}

int64_t top1(const at::Tensor& row) { return row.argmax().item<int64_t>(); }

int64_t serving_steps(const CheckContext& c, int64_t full) {
  const int64_t n = std::min<int64_t>(c.opts.tokens, full);
  return c.opts.serving_tokens > 0 ? std::min(n, c.opts.serving_tokens) : n;
}

int64_t inside_window_steps(const CheckContext& c, int64_t n, int64_t prompt) {
  return c.opts.past_window ? n : std::min(n, c.model->config().context - prompt + 1);
}

std::vector<LiveRow> admit(CheckContext& c, const std::vector<std::vector<int64_t>>& prompts, std::vector<RowRun>& runs) {
  at::Tensor logits;
  const std::vector<int64_t> ids = c.target.serving().add_rows(prompts, logits);  // logits (R, V)
  const at::Tensor l = logits.to(at::kCPU);
  runs.resize(prompts.size());
  std::vector<LiveRow> live;
  for (size_t b = 0; b < prompts.size(); ++b) {
    runs[b] = {prompts[b], static_cast<int64_t>(prompts[b].size()), {}};
    live.push_back({ids[b], &runs[b], l[static_cast<int64_t>(b)].clone()});
  }
  return live;
}

void step_with(DecodeTarget& t, std::vector<LiveRow>& live, const std::vector<int64_t>& ids) {
  std::vector<int64_t> rows;
  for (size_t i = 0; i < live.size(); ++i) {
    live[i].run->logits.push_back(live[i].next);
    live[i].run->seq.push_back(ids[i]);
    rows.push_back(live[i].id);
  }
  const at::Tensor out = t.serving().step_rows(rows, ids).to(at::kCPU);  // (R, V)
  for (size_t i = 0; i < live.size(); ++i) live[i].next = out[static_cast<int64_t>(i)].clone();
}

void step_all(DecodeTarget& t, std::vector<LiveRow>& live) {
  std::vector<int64_t> ids;
  for (const LiveRow& row : live) ids.push_back(top1(row.next));
  step_with(t, live, ids);
}

void finish(std::vector<LiveRow>& live) {
  for (LiveRow& row : live) row.run->logits.push_back(row.next), row.run->seq.push_back(top1(row.next));
}

bool judge_rows(CheckContext& c, CheckResult& r, const std::vector<std::pair<std::string, const RowRun*>>& runs, double& worst) {
  for (const auto& [name, run] : runs) {
    const int64_t n = static_cast<int64_t>(run->logits.size());
    if (n == 0) continue;
    const at::Tensor seq = at::tensor(run->seq, at::kLong).unsqueeze(0).to(c.opts.prompt.device());  // (1, L)
    const StepReference ref = reference_for(c.model, seq, run->prompt, n);
    const at::Tensor got = at::stack(run->logits, 0).unsqueeze(0);  // (1, n, V)
    const StepDiffs band = judge_row(r, c.tol(), got, ref, run->prompt);
    worst = std::max(worst, band.worst);
    if (!r.ok()) {
      r.detail = name + " vs its sequence alone, " + r.detail;
      return false;
    }
  }
  return true;
}

void Seen::add(int64_t position, const at::Tensor& l) { positions.push_back(position), logits.push_back(l.to(at::kCPU)); }

void decode_seen(DecodeTarget& t, int64_t row, int64_t n, Seen& s) {
  for (int64_t i = 0; i < n; ++i) {
    s.seq.push_back(top1(s.logits.back()));
    s.add(static_cast<int64_t>(s.seq.size()) - 1, t.serving().step_rows({row}, {s.seq.back()}).to(at::kCPU)[0]);
  }
}

bool judge_seen(CheckContext& c, CheckResult& r, const Seen& s, const std::string& what, double* worst) {
  std::vector<int64_t> full(s.seq.begin(), s.seq.end());
  full.push_back(0);  // the last seen logits predict a token not chosen yet: any id, it is never read
  const at::Tensor seq = at::tensor(full, at::kLong).unsqueeze(0).to(c.opts.prompt.device());  // (1, L + 1)
  const StepReference ref = reference_for(c.model, seq, 1, seq.size(1) - 1);                   // full: (1, L, V)
  // Inside the window the full forward; past it the banded one (SPEC 4's window), position for position.
  const bool inside = *std::max_element(s.positions.begin(), s.positions.end()) < ref.full.size(1);
  const at::Tensor& against = inside ? ref.full : ref.band;
  const at::Tensor idx = at::tensor(s.positions, at::kLong).to(against.device());
  const StepDiffs d = judge_positions(r, c.tol(), at::stack(s.logits, 0).unsqueeze(0), against.index_select(1, idx), s.positions);
  if (worst) *worst = std::max(*worst, d.worst);
  if (!r.ok()) r.detail = what + ": " + r.detail;
  return r.ok();
}

namespace {
// Prompts admitted together and decoded together for n steps, each row judged against its own
// sequence alone (named by `name(b)`); false when one is over. `worst` is the largest |diff|.
bool run_together(CheckContext& c, CheckResult& r, const std::vector<std::vector<int64_t>>& prompts, int64_t n,
                  const std::function<std::string(size_t)>& name, double& worst) {
  c.target.reset();
  std::vector<RowRun> runs;
  std::vector<LiveRow> live = admit(c, prompts, runs);
  for (int64_t i = 0; i + 1 < n; ++i) step_all(c.target, live);
  finish(live);
  std::vector<std::pair<std::string, const RowRun*>> judged;
  for (size_t b = 0; b < runs.size(); ++b) judged.emplace_back(name(b), &runs[b]);
  return judge_rows(c, r, judged, worst);
}
}  // namespace

// Rows of different prompt lengths prefilled together and decoded together until the shortest is
// past the window: each row against its sequence alone.
namespace {
const std::vector<int64_t> kRaggedLengths = {3, 9, 17};  // ragged's prompt lengths
}  // namespace

void ragged_check(CheckContext& c, CheckResult& r) {
  const int64_t ctx = c.model->config().context;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int64_t> lengths;  // kRaggedLengths, or others in a held-out run (increasing either way)
  for (size_t b = 0; b < kRaggedLengths.size(); ++b) {
    prompts.push_back(row_prompt(c, kRaggedLengths[b] + (c.opts.variation ? 6 * static_cast<int64_t>(b) : 0), static_cast<int64_t>(b)));
    lengths.push_back(static_cast<int64_t>(prompts.back().size()));
  }
  // The shortest prompt's row goes kPastTheWindow past the window; in a run kept inside it, the longest
  // prompt's row stops at its edge.
  const int64_t n = inside_window_steps(c, serving_steps(c, ctx - lengths[0] + kPastTheWindow), lengths.back());
  double worst = 0;
  if (!run_together(c, r, prompts, n, [&](size_t b) { return "row " + std::to_string(b) + " (a " + std::to_string(lengths[b]) + "-token prompt)"; },
                    worst))
    return;
  r.figure = worst;
  set_result(r, true, "prompts of " + std::to_string(lengths[0]) + ", " + std::to_string(lengths[1]) + " and " + std::to_string(lengths[2]) + " tokens in one batch, " + std::to_string(n) +
                          " steps: every row equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// Rows A and B run; A leaves and C joins (taking A's slot); B and C run on past the window.
void join_leave_check(CheckContext& c, CheckResult& r) {
  constexpr int64_t kLeaveAfter = 24;  // steps A and B run together before A leaves
  const int64_t ctx = c.model->config().context;
  c.target.reset();
  std::vector<RowRun> ab, cc;
  std::vector<LiveRow> live = admit(c, {row_prompt(c, 3, 0), row_prompt(c, 5, 1)}, ab);
  for (int64_t i = 0; i < kLeaveAfter; ++i) step_all(c.target, live);
  // A finishes: its last logits are recorded, and it leaves.
  std::vector<LiveRow> leaving = {live[0]};
  finish(leaving);
  c.target.serving().release_row(live[0].id);
  live.erase(live.begin());
  // C joins the running batch.
  live.push_back(admit(c, {row_prompt(c, 4, 2)}, cc)[0]);
  const RowRun &A = ab[0], &B = ab[1];
  // B past the window (or, in a run kept inside it, to its edge).
  const int64_t steps = inside_window_steps(c, serving_steps(c, ctx + kPastTheWindow - B.prompt - kLeaveAfter), B.prompt + kLeaveAfter);
  for (int64_t i = 0; i < steps; ++i) step_all(c.target, live);
  finish(live);
  double worst = 0;
  if (!judge_rows(c, r, {{"row A (left after 24 steps)", &A}, {"row B (ran throughout)", &B}, {"row C (joined as A left)", &cc[0]}}, worst))
    return;
  r.figure = worst;
  set_result(r, true, "A left after " + std::to_string(kLeaveAfter) + " steps, C joined in its place, B ran " +
                          std::to_string(B.logits.size()) + " steps: every row equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// A row forked twice: after 16 steps (the parent's entries still from 0) and again far past the
// window, where a cache's live entries no longer start at its first slot (a static cache has
// compacted, a rolling one trimmed). The parent goes on greedily, each child from the runner-up;
// all past the window, each against its own sequence alone (so the parent is untouched by them).
void fork_check(CheckContext& c, CheckResult& r) {
  constexpr int64_t kForkAfter = 16;  // decode steps before the first fork
  const int64_t ctx = c.model->config().context;
  c.target.reset();
  std::vector<RowRun> runs;
  runs.reserve(3);  // the parent's and the children's runs: the live rows point into it
  std::vector<LiveRow> live = admit(c, {row_prompt(c, 3, 0)}, runs);
  const int64_t prompt = runs[0].prompt;
  // The second fork: its parent kRollbackEntries + 16 past the window, its entries moved. The row
  // runs that far whatever --tokens (not with --no-past-window: then it stops at the window's edge).
  const int64_t late = ctx + kRollbackEntries + 16 - prompt;
  const int64_t total = c.opts.past_window ? late + kPastTheWindow : serving_steps(c, ctx - prompt);
  std::vector<int64_t> at;  // the parent's step at each fork
  for (int64_t i = 0; i < total; ++i) {
    std::vector<int64_t> ids;
    for (const LiveRow& row : live) ids.push_back(top1(row.next));
    if (i == kForkAfter || (i == late && c.opts.past_window)) {
      // The parent takes its greedy token, the child the runner-up: from here they differ.
      const int64_t child = c.target.serving().fork_row(live[0].id);
      runs.push_back(runs[0]);  // the child shares the parent's history so far
      live.push_back({child, &runs.back(), live[0].next});
      ids.push_back(std::get<1>(live[0].next.topk(2))[1].item<int64_t>());
      at.push_back(i);
    }
    step_with(c.target, live, ids);
  }
  finish(live);
  std::vector<std::pair<std::string, const RowRun*>> judged = {{"the parent", &runs[0]}};
  for (size_t k = 0; k < at.size(); ++k)
    judged.emplace_back("the child forked after " + std::to_string(at[k]) + " steps (at position " + std::to_string(prompt + at[k]) + ")",
                        &runs[k + 1]);
  double worst = 0;
  if (!judge_rows(c, r, judged, worst)) return;
  r.figure = worst;
  std::string forks;
  for (int64_t a : at) forks += (forks.empty() ? "" : " and ") + std::to_string(a);
  set_result(r, true, "forked after " + forks + " steps" +
                          (at.size() < 2 ? " (not again past the window: " + c.opts.inside_window_why + ")" : std::string()) +
                          ", the parent ran " + std::to_string(runs[0].logits.size()) +
                          " steps: parent and children equal their sequences alone (worst |diff| " + sci(worst) + ")");
}

// Rows sharing a long prefix (the fixture's 96 tokens) with tails of their own, in one batch (what
// cascade attention and prefix-sharing kernels serve from one copy of the prefix): each row against
// its sequence alone for 32 steps.
namespace {
constexpr int64_t kSharedPrefix = 96;  // tokens the rows share (at most 3/8 of a smaller window)
const std::vector<int64_t> kSharedTails = {1, 6, 13};
}  // namespace

void shared_prefix_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  const int64_t shared = std::min<int64_t>(kSharedPrefix, ctx * 3 / 8);
  const std::vector<int64_t>& tails = kSharedTails;
  const std::vector<int64_t> prefix = serving_prompt(shared, 0, V);
  std::vector<std::vector<int64_t>> prompts;
  for (size_t b = 0; b < tails.size(); ++b) {
    prompts.push_back(prefix);
    const std::vector<int64_t> tail = serving_prompt(tails[b], 3 + static_cast<int64_t>(b), V);
    prompts.back().insert(prompts.back().end(), tail.begin(), tail.end());
  }
  const int64_t n = serving_steps(c, 32);
  double worst = 0;
  if (!run_together(c, r, prompts, n,
                    [&](size_t b) { return "row " + std::to_string(b) + " (the prefix and a " + std::to_string(tails[b]) + "-token tail)"; },
                    worst))
    return;
  r.figure = worst;
  set_result(r, true, std::to_string(tails.size()) + " rows sharing a " + std::to_string(shared) + "-token prefix (tails of " +
                          ranges_text(tails) + "), " + std::to_string(n) +
                          " steps: every row equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// Speculative drafts rejected: at three points (inside the window, across its edge, past it) a draft
// is fed and all but its first token rolled back; the run must equal the sequence without them.
void rollback_check(CheckContext& c, CheckResult& r) {
  constexpr int64_t kDraft = 4, kRejected = 3;  // tokens fed per draft, and rolled back
  constexpr int64_t kInside = 40;                // the step of the draft inside the window
  constexpr int64_t kPastSteps = 24, kRunPast = 48;  // the draft past the window, and how far the run goes
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  c.target.reset();
  std::vector<RowRun> runs;
  std::vector<LiveRow> live = admit(c, {row_prompt(c, 3, 0)}, runs);
  RowRun& A = runs[0];
  const int64_t row = live[0].id;
  at::Tensor current = live[0].next;
  // Steps at which a draft starts: inside the window, one that crosses its edge, one past it.
  const std::vector<int64_t> points = {kInside, ctx - A.prompt - 2, ctx + kPastSteps};
  const int64_t total = std::min<int64_t>(c.opts.tokens, ctx + kRunPast);
  int64_t drafts = 0;
  for (int64_t i = 0; static_cast<int64_t>(A.logits.size()) < total;) {
    if (std::find(points.begin(), points.end(), i) != points.end()) {
      // kDraft draft tokens, none of them the greedy choice; the first kDraft - kRejected are accepted.
      std::vector<at::Tensor> seen = {current};
      std::vector<int64_t> toks;
      for (int64_t d = 0; d < kDraft; ++d) {
        toks.push_back((top1(seen.back()) + 1) % V);
        seen.push_back(c.target.serving().step_rows({row}, {toks.back()}).to(at::kCPU)[0].clone());
      }
      c.target.serving().truncate_row(row, kRejected);
      for (int64_t d = 0; d < kDraft - kRejected; ++d) A.logits.push_back(seen[d]), A.seq.push_back(toks[d]);
      current = seen[kDraft - kRejected];
      i += kDraft - kRejected;
      ++drafts;
      continue;
    }
    const int64_t next = top1(current);
    A.logits.push_back(current);
    A.seq.push_back(next);
    if (static_cast<int64_t>(A.logits.size()) < total) current = c.target.serving().step_rows({row}, {next}).to(at::kCPU)[0].clone();
    ++i;
  }
  double worst = 0;
  if (!judge_rows(c, r, {{"the row", &A}}, worst)) return;
  r.figure = worst;
  set_result(r, true, std::to_string(drafts) + " drafts of " + std::to_string(kDraft) + " tokens, " + std::to_string(kRejected) +
                          " rolled back each (inside the window, across its edge, past it): the run equals the sequence "
                          "without them (worst |diff| " + sci(worst) + ")");
}

namespace {
// "1-3,5,31-33" for ascending sizes.
std::string ranges(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return s;
}
// The batch sizes of batch-sizes: where engines' kernels and captured graphs change shape, at 16 and 32.
const std::vector<int64_t> kBatchSizes = {1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 17, 31, 32, 33};
}  // namespace

std::string list_text(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

std::string ranges_text(const std::vector<int64_t>& v) {
  std::string s = ranges(v);  // "1-8,15-17,31-33" -> "1-8, 15-17 and 31-33"
  for (size_t i = 0; (i = s.find(',', i)) != std::string::npos;) s.replace(i, 1, ", "), i += 2;
  if (const size_t last = s.rfind(", "); last != std::string::npos) s.replace(last, 2, " and ");
  return s;
}

// Batch sizes 1 to 8, 15 to 17 and 31 to 33 (where engines' kernels and captured graphs change
// shape at 16 and 32) through the target's own loop: each row within the tolerance of that row alone (a
// failure otherwise), and how far from bitwise identical, measured per batch size.
void batch_sizes_check(CheckContext& c, CheckResult& r) {
  constexpr int64_t kSteps = 16;
  const std::vector<int64_t>& asked = c.opts.batch_sizes.empty() ? kBatchSizes : c.opts.batch_sizes;
  const int64_t kMaxBatch = asked.back();
  std::vector<int64_t> sizes;
  const int64_t limit = c.target.offers().max_rows.value_or(kMaxBatch);  // an engine's own batch limit
  for (int64_t B : asked)
    if (B <= limit) sizes.push_back(B);
  if (sizes.empty()) {
    r.status = Status::Skipped;
    r.detail = "skipped: the target takes at most " + std::to_string(limit) + " rows, fewer than every batch size asked (" + ranges(asked) + ")";
    return;
  }
  const int64_t most = sizes.back();
  const int64_t V = c.model->config().vocab_size, n = std::min<int64_t>(c.opts.tokens, kSteps);
  const at::Tensor base = c.opts.prompt.narrow(0, 0, 1);
  const int64_t T0 = base.size(1);
  const at::Tensor all = shifted_rows(base, most, V, 1);  // (most, T0): row b is the same prompt in every batch
  std::vector<at::Tensor> alone;
  for (int64_t b = 0; b < most; ++b) alone.push_back(c.target.generate(all.narrow(0, b, 1), n, greedy()).logits.to(at::kCPU));
  double worst = 0;
  std::vector<int64_t> exact, inexact;
  for (int64_t B : sizes) {
    const Generation g = c.target.generate(all.narrow(0, 0, B), n, greedy());
    const at::Tensor got = g.logits.to(at::kCPU);
    double d = 0, kl = 0;  // kl: under a KL budget, the largest mean KL(alone || in the batch) of a row
    for (int64_t b = 0; b < B; ++b) {
      // Compared up to where the row's tokens part from its run alone (a near-tie picked differently).
      int64_t upto = n;
      const at::Tensor mine = g.seq.narrow(0, b, 1).to(at::kCPU);
      const at::Tensor ids_alone = alone[b].argmax(-1);  // (1, n): what greedy took alone
      for (int64_t i = 0; i + 1 < n; ++i)
        if (mine[0][T0 + i].item<int64_t>() != ids_alone[0][i].item<int64_t>()) {
          upto = i + 1;
          break;
        }
      const at::Tensor mine_l = got.narrow(0, b, 1).narrow(1, 0, upto), alone_l = alone[b].narrow(1, 0, upto);  // (1, upto, V)
      d = std::max(d, (mine_l - alone_l).abs().max().item<double>());
      if (c.tol().max_kl) {
        const at::Tensor p = alone_l.to(at::kDouble).log_softmax(-1), q = mine_l.to(at::kDouble).log_softmax(-1);
        kl = std::max(kl, (p.exp() * (p - q)).sum(-1).mean().item<double>());
      }
    }
    r.stats["invariance_b" + std::to_string(B)] = d;
    worst = std::max(worst, d);
    (d == 0 ? exact : inexact).push_back(B);
    // Under a KL budget (an approximate target) a row is judged by its distribution, as every row is.
    if (c.tol().max_kl && kl > *c.tol().max_kl)
      return set_result(r, false, "batch " + std::to_string(B) + ": a row's mean KL from itself alone is " + sci(kl) + " > " +
                                      sci(*c.tol().max_kl) + " (|diff| " + sci(d) + ")");
    if (!c.tol().max_kl && d > c.tol().logits)
      return set_result(r, false, "batch " + std::to_string(B) + ": a row differs from itself alone by " + sci(d) + " > " +
                                      sci(c.tol().logits));
    if (c.tol().max_kl) r.stats["invariance_kl_b" + std::to_string(B)] = kl;
  }
  r.figure = worst;
  const std::string within = c.tol().max_kl ? "mean KL " + sci(*c.tol().max_kl) : sci(c.tol().logits);
  r.bound = (c.tol().max_kl ? "mean KL <= " + sci(*c.tol().max_kl) : "max |diff| <= " + sci(c.tol().logits)) +
            (c.opts.require_batch_invariance ? ", and bitwise identical" : "");
  const std::string what = "batch sizes " + ranges(sizes) +
                           (most < kMaxBatch ? " (the target takes at most " + std::to_string(limit) + " rows)" : "") + ", " +
                           std::to_string(n) + " steps: every row within " + within + " of itself alone; bitwise identical at " + (exact.empty() ? std::string("none") : ranges(exact)) +
                           (inexact.empty() ? "" : ", largest |diff| " + sci(worst) + " (at " + ranges(inexact) + ")");
  set_result(r, !(c.opts.require_batch_invariance && worst > 0), what);
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

CheckDef ragged_def() {
  return {check::kRagged,
  "rows of different prompt lengths (" + list_text(kRaggedLengths) + ") in one batch each equal their sequence alone, inside and past the window",
  ragged_check, kServingRow, Judge::Reference, {Op::Ragged}, Cost::Run, "positions counted from the padded length", 3};
}

CheckDef join_leave_def() {
  return {check::kJoinLeave,
  "a row leaving and another joining a running batch change no row: each equals its sequence alone", join_leave_check,
  kServingRow, Judge::Reference, {Op::Join}, Cost::Run, "a joined row stepped at the batch's position, a freed slot reused unreset", 2};
}

CheckDef fork_def() {
  return {check::kFork,
  "a row forked early and again far past the window (its entries moved): parent and children continue apart, each "
  "equal to its sequence alone",
  fork_check, kServingRow | Tag::Long, Judge::Reference, {Op::Fork}, Cost::Run,
  "a fork sharing storage with its parent, a fork that loses where the parent's live entries begin", 3};
}

CheckDef rollback_def() {
  return {check::kRollback,
  "drafts rolled back inside the window, across its edge and past it leave the sequence without them", rollback_check,
  kServingRow, Judge::Reference, {Op::Truncate}, Cost::Run,
  "a rollback one entry off, one that cannot bring back the entries a draft pushed out of the window"};
}

CheckDef batch_sizes_def() {
  return {check::kBatchSizes,
  "batch sizes " + ranges_text(kBatchSizes) + " (bucket edges): every row within the tolerance of itself alone; bitwise "
  "invariance measured",
  batch_sizes_check,
  static_cast<Tags>(Tag::Serving), Judge::Invariance, {}, Cost::Runs,
  "a row over the tolerance from itself alone; with --require-batch-invariance, any difference"};
}

CheckDef shared_prefix_def() {
  return {check::kSharedPrefix,
  "rows sharing a " + std::to_string(kSharedPrefix) + "-token prefix with tails of their own, in one batch: each equals its sequence alone",
  shared_prefix_check, static_cast<Tags>(Tag::Serving), Judge::Reference, {Op::Ragged}, Cost::Run,
  "a shared prefix served to the wrong row or at the wrong positions (cascade attention)", 3};
}

}  // namespace tinygpt::checks
