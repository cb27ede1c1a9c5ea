// The serving checks of the check table: what serving engines do to a KV cache - ragged batches,
// rows joining and leaving, fork, rollback - each row judged against our reference model run on
// that row's own sequence alone, inside and past the window (SPEC 4). And batch sizes 1 to 8: every
// row within the tolerance of itself alone, with how far from bitwise identical it is, measured.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "model_checks.h"
#include "tinygpt/checks/check_suite.h"

namespace tinygpt::checks {

namespace {

// One row of a serving run: its whole sequence (prompt first) and the logits each new token was
// chosen from: logits[i] (V) predicts seq[prompt + i].
struct RowRun {
  std::vector<int64_t> seq;
  int64_t prompt = 0;
  std::vector<at::Tensor> logits;
};

bool skip_serving(CheckContext& c, CheckResult& r, const std::string& op) {
  const std::string why = c.target.serving_unsupported(op);
  if (why.empty()) return false;
  r.status = Status::Skipped;
  r.detail = "skipped: " + why;
  return true;
}

// A deterministic prompt of `len` ids, row `b` (different rows, different ids).
std::vector<int64_t> prompt_ids(int64_t len, int64_t b, int64_t vocab) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back((1 + 7 * i + 131 * b) % vocab);
  return p;
}

int64_t top1(const at::Tensor& row) { return row.argmax().item<int64_t>(); }

// Decode steps of ragged, join-leave and fork: `full` (until 16 past the window), or fewer where the
// options cap them (serving_tokens).
int64_t serving_steps(const CheckContext& c, int64_t full) {
  const int64_t n = std::min<int64_t>(c.opts.tokens, full);
  return c.opts.serving_tokens > 0 ? std::min(n, c.opts.serving_tokens) : n;
}

// Judges every row against the reference of its own sequence alone; fills `r` and returns false at
// the first row over the tolerance. `worst` collects the largest banded |diff|.
bool judge_rows(CheckContext& c, CheckResult& r, const std::vector<std::pair<std::string, RowRun>>& runs, double& worst) {
  for (const auto& [name, run] : runs) {
    const int64_t n = static_cast<int64_t>(run.logits.size());
    if (n == 0) continue;
    const at::Tensor seq = at::tensor(run.seq, at::kLong).unsqueeze(0).to(c.opts.prompt.device());  // (1, L)
    const StepReference ref = reference_for(c.model, seq, run.prompt, n);
    const at::Tensor got = at::stack(run.logits, 0).unsqueeze(0);  // (1, n, V)
    const StepDiffs band = judge_row(r, c.opts.tolerance, got, ref, run.prompt);
    worst = std::max(worst, band.worst);
    if (!r.ok()) {
      r.detail = name + " vs its sequence alone, " + r.detail;
      return false;
    }
  }
  return true;
}

// Steps every live row once with its greedy token (or the token `pick` names), recording logits.
void step_all(DecodeTarget& t, std::vector<std::pair<int64_t, RowRun*>>& live, std::vector<at::Tensor>& current) {
  std::vector<int64_t> rows, ids;
  for (size_t i = 0; i < live.size(); ++i) {
    RowRun& run = *live[i].second;
    run.logits.push_back(current[i]);
    const int64_t next = top1(current[i]);
    run.seq.push_back(next);
    rows.push_back(live[i].first);
    ids.push_back(next);
  }
  const at::Tensor out = t.step_rows(rows, ids).to(at::kCPU);  // (R, V)
  for (size_t i = 0; i < live.size(); ++i) current[i] = out[static_cast<int64_t>(i)].clone();
}

// Rows of different prompt lengths (3, 9, 17) prefilled together and decoded together past the
// window: each row against its sequence alone.
void ragged_check(CheckContext& c, CheckResult& r) {
  if (skip_serving(c, r, "ragged")) return;
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  const std::vector<int64_t> lengths = {3, 9, 17};
  std::vector<std::vector<int64_t>> prompts;
  for (size_t b = 0; b < lengths.size(); ++b) prompts.push_back(prompt_ids(lengths[b], static_cast<int64_t>(b), V));
  c.target.reset();
  at::Tensor logits;
  const auto rows = c.target.add_rows(prompts, logits);
  std::vector<RowRun> runs(rows.size());
  std::vector<std::pair<int64_t, RowRun*>> live;
  std::vector<at::Tensor> current;
  for (size_t b = 0; b < rows.size(); ++b) {
    runs[b] = {prompts[b], lengths[b], {}};
    live.emplace_back(rows[b], &runs[b]);
    current.push_back(logits.to(at::kCPU)[static_cast<int64_t>(b)].clone());
  }
  const int64_t n = serving_steps(c, ctx - lengths[0] + 16);  // the shortest row 16 past the window
  for (int64_t i = 0; i < n; ++i) {
    if (i + 1 == n) {  // the last logits are recorded, not fed
      for (size_t b = 0; b < live.size(); ++b) live[b].second->logits.push_back(current[b]), live[b].second->seq.push_back(top1(current[b]));
      break;
    }
    step_all(c.target, live, current);
  }
  std::vector<std::pair<std::string, RowRun>> judged;
  for (size_t b = 0; b < runs.size(); ++b) judged.emplace_back("row " + std::to_string(b) + " (a " + std::to_string(lengths[b]) + "-token prompt)", runs[b]);
  double worst = 0;
  if (!judge_rows(c, r, judged, worst)) return;
  r.figure = worst;
  set_result(r, true, "prompts of 3, 9 and 17 tokens in one batch, " + std::to_string(n) + " steps: every row equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// Rows A and B run; A leaves and C joins (taking A's slot); B and C run on past the window.
void join_leave_check(CheckContext& c, CheckResult& r) {
  if (skip_serving(c, r, "join")) return;
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  c.target.reset();
  RowRun A{prompt_ids(3, 0, V), 3, {}}, B{prompt_ids(5, 1, V), 5, {}}, C{prompt_ids(4, 2, V), 4, {}};
  at::Tensor logits;
  const auto ab = c.target.add_rows({A.seq, B.seq}, logits);
  std::vector<std::pair<int64_t, RowRun*>> live = {{ab[0], &A}, {ab[1], &B}};
  std::vector<at::Tensor> current = {logits.to(at::kCPU)[0].clone(), logits.to(at::kCPU)[1].clone()};
  for (int i = 0; i < 24; ++i) step_all(c.target, live, current);
  // A finishes: its last logits are recorded, and it leaves.
  A.logits.push_back(current[0]);
  A.seq.push_back(top1(current[0]));
  c.target.release_row(ab[0]);
  live.erase(live.begin());
  current.erase(current.begin());
  // C joins the running batch.
  const auto cc = c.target.add_rows({C.seq}, logits);
  live.emplace_back(cc[0], &C);
  current.push_back(logits.to(at::kCPU)[0].clone());
  const int64_t steps = serving_steps(c, ctx + 16 - 5 - 24);  // B 16 past the window
  for (int64_t i = 0; i < steps; ++i) step_all(c.target, live, current);
  for (size_t b = 0; b < live.size(); ++b) live[b].second->logits.push_back(current[b]), live[b].second->seq.push_back(top1(current[b]));
  double worst = 0;
  if (!judge_rows(c, r, {{"row A (left after 24 steps)", A}, {"row B (ran throughout)", B}, {"row C (joined as A left)", C}}, worst)) return;
  r.figure = worst;
  set_result(r, true, "A left after 24 steps, C joined in its place, B ran " + std::to_string(B.logits.size()) +
                          " steps: every row equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// A row forked after 16 steps: the parent goes on greedily, the child from the runner-up; both past
// the window, each against its own sequence alone (so the parent is untouched by the child).
void fork_check(CheckContext& c, CheckResult& r) {
  if (skip_serving(c, r, "fork")) return;
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  c.target.reset();
  RowRun P{prompt_ids(3, 0, V), 3, {}};
  at::Tensor logits;
  const auto p = c.target.add_rows({P.seq}, logits);
  std::vector<std::pair<int64_t, RowRun*>> live = {{p[0], &P}};
  std::vector<at::Tensor> current = {logits.to(at::kCPU)[0].clone()};
  for (int i = 0; i < 16; ++i) step_all(c.target, live, current);
  RowRun K = P;  // the child shares the parent's history so far
  const int64_t child = c.target.fork_row(p[0]);
  // The parent takes its greedy token, the child the runner-up: from here they differ.
  const at::Tensor top2 = std::get<1>(current[0].topk(2));
  const int64_t mine = top2[0].item<int64_t>(), theirs = top2[1].item<int64_t>();
  P.logits.push_back(current[0]), P.seq.push_back(mine);
  K.logits.push_back(current[0]), K.seq.push_back(theirs);
  at::Tensor out = c.target.step_rows({p[0], child}, {mine, theirs}).to(at::kCPU);
  live = {{p[0], &P}, {child, &K}};
  current = {out[0].clone(), out[1].clone()};
  const int64_t steps = serving_steps(c, ctx + 16 - 3 - 17);  // both 16 past the window
  for (int64_t i = 0; i < steps; ++i) step_all(c.target, live, current);
  for (size_t b = 0; b < live.size(); ++b) live[b].second->logits.push_back(current[b]), live[b].second->seq.push_back(top1(current[b]));
  double worst = 0;
  if (!judge_rows(c, r, {{"the parent", P}, {"the child (forked after 16 steps)", K}}, worst)) return;
  r.figure = worst;
  set_result(r, true, "forked after 16 steps, parent and child " + std::to_string(P.logits.size()) +
                          " steps each: both equal their sequences alone (worst |diff| " + sci(worst) + ")");
}

// Speculative drafts rejected: at three points (inside the window, across its edge, past it) 4 draft
// tokens are fed and the last 3 rolled back; the run must equal the sequence without them.
void rollback_check(CheckContext& c, CheckResult& r) {
  if (skip_serving(c, r, "truncate")) return;
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  c.target.reset();
  RowRun A{prompt_ids(3, 0, V), 3, {}};
  at::Tensor logits;
  const int64_t row = c.target.add_rows({A.seq}, logits)[0];
  at::Tensor current = logits.to(at::kCPU)[0].clone();
  const int64_t k = 4, j = 3;
  const std::vector<int64_t> points = {40, ctx - 3 - 2, ctx + 24};  // steps at which a draft starts
  const int64_t total = std::min<int64_t>(c.opts.tokens, ctx + 48);
  int64_t drafts = 0;
  for (int64_t i = 0; static_cast<int64_t>(A.logits.size()) < total;) {
    if (std::find(points.begin(), points.end(), i) != points.end()) {
      // k draft tokens, none of them the greedy choice; the first k - j are accepted.
      std::vector<at::Tensor> seen = {current};
      std::vector<int64_t> toks;
      for (int64_t d = 0; d < k; ++d) {
        toks.push_back((top1(seen.back()) + 1) % V);
        seen.push_back(c.target.step_rows({row}, {toks.back()}).to(at::kCPU)[0].clone());
      }
      c.target.truncate_row(row, j);
      for (int64_t d = 0; d < k - j; ++d) A.logits.push_back(seen[d]), A.seq.push_back(toks[d]);
      current = seen[k - j];
      i += k - j;
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
  if (!judge_rows(c, r, {{"the row", A}}, worst)) return;
  r.figure = worst;
  set_result(r, true, std::to_string(drafts) + " drafts of " + std::to_string(k) + " tokens, " + std::to_string(j) +
                          " rolled back each (inside the window, across its edge, past it): the run equals the sequence "
                          "without them (worst |diff| " + sci(worst) + ")");
}

// Batch sizes 1 to 8 through the target's own loop: each row within the tolerance of that row alone
// (a failure otherwise), and how far from bitwise identical, measured per batch size.
void batch_sizes_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size, n = std::min<int64_t>(c.opts.tokens, 24);
  const at::Tensor base = c.opts.prompt.narrow(0, 0, 1);
  const at::Tensor all = shifted_rows(base, 8, V, 1);  // (8, T0): row b is the same prompt in every batch
  std::vector<at::Tensor> alone;
  for (int64_t b = 0; b < 8; ++b) alone.push_back(c.target.generate(all.narrow(0, b, 1), n, greedy()).logits.to(at::kCPU));
  double worst = 0;
  std::string exact, inexact;
  for (int64_t B = 1; B <= 8; ++B) {
    const Generation g = c.target.generate(all.narrow(0, 0, B), n, greedy());
    const at::Tensor got = g.logits.to(at::kCPU);
    double d = 0;
    for (int64_t b = 0; b < B; ++b) {
      // Compared up to where the row's tokens part from its run alone (a near-tie picked differently).
      const int64_t T0 = base.size(1);
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
    (d == 0 ? exact : inexact) += (((d == 0 ? exact : inexact).empty()) ? "" : ",") + std::to_string(B);
    if (d > c.opts.tolerance.logits)
      return set_result(r, false, "batch " + std::to_string(B) + ": a row differs from itself alone by " + sci(d) + " > " +
                                      sci(c.opts.tolerance.logits));
  }
  r.figure = worst;
  r.bound = "max |diff| <= " + sci(c.opts.tolerance.logits) + (c.opts.require_batch_invariance ? ", and bitwise identical" : "");
  const std::string what = "batch sizes 1-8, " + std::to_string(n) + " steps: every row within " + sci(c.opts.tolerance.logits) +
                           " of itself alone; bitwise identical at " + (exact.empty() ? std::string("none") : exact) +
                           (inexact.empty() ? "" : ", largest |diff| " + sci(worst) + " (at " + inexact + ")");
  set_result(r, !(c.opts.require_batch_invariance && worst > 0), what);
}

}  // namespace

std::vector<CheckDef> serving_check_rows() {
  return {
      {"ragged", "rows of different prompt lengths in one batch each equal their sequence alone, inside and past the window",
       ragged_check, /*in_default=*/false},
      {"join-leave", "a row leaving and another joining a running batch change no row: each equals its sequence alone",
       join_leave_check, /*in_default=*/false},
      {"fork", "a forked row and its parent continue apart, each equal to its sequence alone, past the window",
       fork_check, /*in_default=*/false},
      {"rollback", "drafts rolled back inside the window, across its edge and past it leave the sequence without them",
       rollback_check, /*in_default=*/false},
      {"batch-sizes", "batch sizes 1-8: every row within the tolerance of itself alone; bitwise invariance measured",
       batch_sizes_check, /*in_default=*/false},
  };
}

}  // namespace tinygpt::checks
