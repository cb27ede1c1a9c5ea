// The serving rows of the check table: what serving engines do to a KV cache - ragged batches,
// rows joining and leaving, fork, rollback - each row judged against our reference model run on
// that row's own sequence alone, inside and past the window (SPEC 4). And batch sizes 1 to 8: every
// row within the tolerance of itself alone, with how far from bitwise identical it is, measured.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "rows.h"

namespace tinygpt::checks {

std::vector<int64_t> serving_prompt(int64_t len, int64_t b, int64_t vocab) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back((1 + 7 * i + 131 * b) % vocab);
  return p;
}

int64_t top1(const at::Tensor& row) { return row.argmax().item<int64_t>(); }

int64_t serving_steps(const CheckContext& c, int64_t full) {
  const int64_t n = std::min<int64_t>(c.opts.tokens, full);
  return c.opts.serving_tokens > 0 ? std::min(n, c.opts.serving_tokens) : n;
}

std::vector<LiveRow> admit(CheckContext& c, const std::vector<std::vector<int64_t>>& prompts, std::vector<RowRun>& runs) {
  at::Tensor logits;
  const std::vector<int64_t> ids = c.target.add_rows(prompts, logits);  // logits (R, V)
  const at::Tensor l = logits.to(at::kCPU);
  runs.resize(prompts.size());
  std::vector<LiveRow> live;
  for (size_t b = 0; b < prompts.size(); ++b) {
    runs[b] = {prompts[b], static_cast<int64_t>(prompts[b].size()), {}};
    live.push_back({ids[b], &runs[b], l[static_cast<int64_t>(b)].clone()});
  }
  return live;
}

void step_all(DecodeTarget& t, std::vector<LiveRow>& live) {
  std::vector<int64_t> rows, ids;
  for (LiveRow& row : live) {
    row.run->logits.push_back(row.next);
    row.run->seq.push_back(top1(row.next));
    rows.push_back(row.id);
    ids.push_back(row.run->seq.back());
  }
  const at::Tensor out = t.step_rows(rows, ids).to(at::kCPU);  // (R, V)
  for (size_t i = 0; i < live.size(); ++i) live[i].next = out[static_cast<int64_t>(i)].clone();
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

// Rows of different prompt lengths prefilled together and decoded together until the shortest is
// past the window: each row against its sequence alone.
void ragged_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  const std::vector<int64_t> lengths = {3, 9, 17};
  std::vector<std::vector<int64_t>> prompts;
  for (size_t b = 0; b < lengths.size(); ++b) prompts.push_back(serving_prompt(lengths[b], static_cast<int64_t>(b), V));
  c.target.reset();
  std::vector<RowRun> runs;
  std::vector<LiveRow> live = admit(c, prompts, runs);
  const int64_t n = serving_steps(c, ctx - lengths[0] + kPastTheWindow);
  for (int64_t i = 0; i + 1 < n; ++i) step_all(c.target, live);
  finish(live);
  std::vector<std::pair<std::string, const RowRun*>> judged;
  for (size_t b = 0; b < runs.size(); ++b)
    judged.emplace_back("row " + std::to_string(b) + " (a " + std::to_string(lengths[b]) + "-token prompt)", &runs[b]);
  double worst = 0;
  if (!judge_rows(c, r, judged, worst)) return;
  r.figure = worst;
  set_result(r, true, "prompts of 3, 9 and 17 tokens in one batch, " + std::to_string(n) +
                          " steps: every row equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// Rows A and B run; A leaves and C joins (taking A's slot); B and C run on past the window.
void join_leave_check(CheckContext& c, CheckResult& r) {
  constexpr int64_t kLeaveAfter = 24;  // steps A and B run together before A leaves
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  c.target.reset();
  std::vector<RowRun> ab, cc;
  std::vector<LiveRow> live = admit(c, {serving_prompt(3, 0, V), serving_prompt(5, 1, V)}, ab);
  for (int64_t i = 0; i < kLeaveAfter; ++i) step_all(c.target, live);
  // A finishes: its last logits are recorded, and it leaves.
  std::vector<LiveRow> leaving = {live[0]};
  finish(leaving);
  c.target.release_row(live[0].id);
  live.erase(live.begin());
  // C joins the running batch.
  live.push_back(admit(c, {serving_prompt(4, 2, V)}, cc)[0]);
  const RowRun &A = ab[0], &B = ab[1];
  const int64_t steps = serving_steps(c, ctx + kPastTheWindow - B.prompt - kLeaveAfter);  // B past the window
  for (int64_t i = 0; i < steps; ++i) step_all(c.target, live);
  finish(live);
  double worst = 0;
  if (!judge_rows(c, r, {{"row A (left after 24 steps)", &A}, {"row B (ran throughout)", &B}, {"row C (joined as A left)", &cc[0]}}, worst))
    return;
  r.figure = worst;
  set_result(r, true, "A left after " + std::to_string(kLeaveAfter) + " steps, C joined in its place, B ran " +
                          std::to_string(B.logits.size()) + " steps: every row equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// A row forked: the parent goes on greedily, the child from the runner-up; both past the window,
// each against its own sequence alone (so the parent is untouched by the child).
void fork_check(CheckContext& c, CheckResult& r) {
  constexpr int64_t kForkAfter = 16;  // decode steps before the fork
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  c.target.reset();
  std::vector<RowRun> runs;
  std::vector<LiveRow> live = admit(c, {serving_prompt(3, 0, V)}, runs);
  for (int64_t i = 0; i < kForkAfter; ++i) step_all(c.target, live);
  RowRun& P = runs[0];
  RowRun K = P;  // the child shares the parent's history so far
  const int64_t child = c.target.fork_row(live[0].id);
  // The parent takes its greedy token, the child the runner-up: from here they differ.
  const at::Tensor top2 = std::get<1>(live[0].next.topk(2));
  const int64_t mine = top2[0].item<int64_t>(), theirs = top2[1].item<int64_t>();
  P.logits.push_back(live[0].next), P.seq.push_back(mine);
  K.logits.push_back(live[0].next), K.seq.push_back(theirs);
  const at::Tensor out = c.target.step_rows({live[0].id, child}, {mine, theirs}).to(at::kCPU);  // (2, V)
  live = {{live[0].id, &P, out[0].clone()}, {child, &K, out[1].clone()}};
  const int64_t steps = serving_steps(c, ctx + kPastTheWindow - P.prompt - (kForkAfter + 1));  // both past the window
  for (int64_t i = 0; i < steps; ++i) step_all(c.target, live);
  finish(live);
  double worst = 0;
  if (!judge_rows(c, r, {{"the parent", &P}, {"the child (forked after 16 steps)", &K}}, worst)) return;
  r.figure = worst;
  set_result(r, true, "forked after " + std::to_string(kForkAfter) + " steps, parent and child " + std::to_string(P.logits.size()) +
                          " steps each: both equal their sequences alone (worst |diff| " + sci(worst) + ")");
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
  std::vector<LiveRow> live = admit(c, {serving_prompt(3, 0, V)}, runs);
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
        seen.push_back(c.target.step_rows({row}, {toks.back()}).to(at::kCPU)[0].clone());
      }
      c.target.truncate_row(row, kRejected);
      for (int64_t d = 0; d < kDraft - kRejected; ++d) A.logits.push_back(seen[d]), A.seq.push_back(toks[d]);
      current = seen[kDraft - kRejected];
      i += kDraft - kRejected;
      ++drafts;
      continue;
    }
    const int64_t next = top1(current);
    A.logits.push_back(current);
    A.seq.push_back(next);
    if (static_cast<int64_t>(A.logits.size()) < total) current = c.target.step_rows({row}, {next}).to(at::kCPU)[0].clone();
    ++i;
  }
  double worst = 0;
  if (!judge_rows(c, r, {{"the row", &A}}, worst)) return;
  r.figure = worst;
  set_result(r, true, std::to_string(drafts) + " drafts of " + std::to_string(kDraft) + " tokens, " + std::to_string(kRejected) +
                          " rolled back each (inside the window, across its edge, past it): the run equals the sequence "
                          "without them (worst |diff| " + sci(worst) + ")");
}

// Batch sizes 1 to kMaxBatch through the target's own loop: each row within the tolerance of that row
// alone (a failure otherwise), and how far from bitwise identical, measured per batch size.
void batch_sizes_check(CheckContext& c, CheckResult& r) {
  constexpr int64_t kMaxBatch = 8, kSteps = 24;
  const int64_t V = c.model->config().vocab_size, n = std::min<int64_t>(c.opts.tokens, kSteps);
  const at::Tensor base = c.opts.prompt.narrow(0, 0, 1);
  const int64_t T0 = base.size(1);
  const at::Tensor all = shifted_rows(base, kMaxBatch, V, 1);  // (kMaxBatch, T0): row b is the same prompt in every batch
  std::vector<at::Tensor> alone;
  for (int64_t b = 0; b < kMaxBatch; ++b) alone.push_back(c.target.generate(all.narrow(0, b, 1), n, greedy()).logits.to(at::kCPU));
  double worst = 0;
  std::string exact, inexact;
  for (int64_t B = 1; B <= kMaxBatch; ++B) {
    const Generation g = c.target.generate(all.narrow(0, 0, B), n, greedy());
    const at::Tensor got = g.logits.to(at::kCPU);
    double d = 0;
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
      d = std::max(d, (got.narrow(0, b, 1).narrow(1, 0, upto) - alone[b].narrow(1, 0, upto)).abs().max().item<double>());
    }
    r.stats["invariance_b" + std::to_string(B)] = d;
    worst = std::max(worst, d);
    std::string& list = d == 0 ? exact : inexact;
    list += (list.empty() ? "" : ",") + std::to_string(B);
    if (d > c.tol().logits)
      return set_result(r, false, "batch " + std::to_string(B) + ": a row differs from itself alone by " + sci(d) + " > " +
                                      sci(c.tol().logits));
  }
  r.figure = worst;
  r.bound = "max |diff| <= " + sci(c.tol().logits) + (c.opts.require_batch_invariance ? ", and bitwise identical" : "");
  const std::string what = "batch sizes 1-" + std::to_string(kMaxBatch) + ", " + std::to_string(n) + " steps: every row within " +
                           sci(c.tol().logits) + " of itself alone; bitwise identical at " + (exact.empty() ? std::string("none") : exact) +
                           (inexact.empty() ? "" : ", largest |diff| " + sci(worst) + " (at " + inexact + ")");
  set_result(r, !(c.opts.require_batch_invariance && worst > 0), what);
}

}  // namespace tinygpt::checks
