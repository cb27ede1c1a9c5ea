// churn: a seeded plan of serving operations on one target, every row judged against its own
// sequence alone at the end (churn.h). The plan, the run and the verdict are public so the
// RapidCheck property can drive the same operations with rc::state and shrink a failure.
#include "tinygpt/checks/churn.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "rows.h"
#include "tinygpt/checks/reference.h"
#include "tinygpt/kv_cache.h"

namespace tinygpt::checks {

std::string to_string(const ChurnOp& op) {
  const std::string row = op.rows.empty() ? "?" : std::to_string(op.rows[0]);
  switch (op.kind) {
    case ChurnOp::Kind::Admit: return "admit " + std::to_string(op.n);
    case ChurnOp::Kind::Step: {
      std::string rows;
      for (int64_t r : op.rows) rows += (rows.empty() ? "" : ",") + std::to_string(r);
      return "step " + rows + " x" + std::to_string(op.n);
    }
    case ChurnOp::Kind::Fork: return "fork " + row;
    case ChurnOp::Kind::Truncate: return "truncate " + row + " by " + std::to_string(op.n);
    case ChurnOp::Kind::Release: return "release " + row;
    case ChurnOp::Kind::Extend: return "extend " + row + " by " + std::to_string(op.n);
  }
  return "?";
}

int64_t churn_token(int64_t row, int64_t position, int64_t rollbacks, int64_t vocab) {
  const uint64_t h = 1 + 7919ull * static_cast<uint64_t>(row) + 104729ull * static_cast<uint64_t>(position) +
                     15485863ull * static_cast<uint64_t>(rollbacks);
  return static_cast<int64_t>((h ^ (h >> 7)) % static_cast<uint64_t>(vocab));
}

int64_t ChurnShape::live() const {
  return std::count_if(rows.begin(), rows.end(), [](const Row& r) { return r.live; });
}

std::vector<int64_t> ChurnShape::live_rows() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].live) out.push_back(static_cast<int64_t>(i));
  return out;
}

bool ChurnShape::applicable(const ChurnOp& op) const {
  auto is_live = [&](int64_t r) { return r >= 0 && r < static_cast<int64_t>(rows.size()) && rows[r].live; };
  using K = ChurnOp::Kind;
  if (op.kind == K::Admit) return op.n >= 1 && op.n <= context && live() < max_live;
  if (op.rows.empty()) return false;
  if (op.kind == K::Step) {
    std::vector<int64_t> sorted = op.rows;
    std::sort(sorted.begin(), sorted.end());
    if (op.n < 1 || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || !std::all_of(sorted.begin(), sorted.end(), is_live))
      return false;
    return past_window || std::all_of(sorted.begin(), sorted.end(), [&](int64_t k) { return rows[k].next + op.n <= context; });
  }
  if (op.rows.size() != 1 || !is_live(op.rows[0])) return false;
  const Row& r = rows[op.rows[0]];
  switch (op.kind) {
    case K::Fork: return live() < max_live;
    case K::Release: return true;
    // SPEC 4's window after a rollback is over the sequence that remains: the cache must still hold it.
    case K::Truncate: return op.n >= 1 && op.n < r.next && r.stored - op.n >= std::min(r.next - op.n, context);
    case K::Extend: return op.n >= 1 && r.next + op.n <= context;  // a chunk ends inside the window
    default: return false;
  }
}

void ChurnShape::apply(const ChurnOp& op) {
  if (!applicable(op)) throw std::logic_error("churn: '" + to_string(op) + "' does not apply here");
  const int64_t keep = context + kRollbackEntries;
  auto feed = [&](Row& r, int64_t n) { r.next += n, r.stored = std::min(r.stored + n, keep); };
  using K = ChurnOp::Kind;
  switch (op.kind) {
    case K::Admit: rows.push_back({true, op.n, op.n, 0}); break;
    case K::Step:
      for (int64_t r : op.rows) feed(rows[r], op.n);
      break;
    case K::Fork: rows.push_back(rows[op.rows[0]]); break;
    case K::Truncate: {
      Row& r = rows[op.rows[0]];
      r.next -= op.n, r.stored -= op.n, ++r.rollbacks;
      break;
    }
    case K::Release: rows[op.rows[0]].live = false; break;
    case K::Extend: feed(rows[op.rows[0]], op.n); break;
  }
}

ChurnRun::ChurnRun(DecodeTarget& target, int64_t vocab, int64_t context, int64_t max_live, bool past_window)
    : target_(target), vocab_(vocab) {
  shape_.context = context;
  shape_.max_live = max_live;
  shape_.past_window = past_window;
  target_.reset();
}

void ChurnRun::apply(const ChurnOp& op) {
  if (!shape_.applicable(op)) throw std::logic_error("churn: '" + to_string(op) + "' does not apply here");
  const int64_t index = static_cast<int64_t>(script_.size());
  touched_.clear();
  auto show = [&](int64_t k, const at::Tensor& l) {  // l (V): logits at the row's newest position
    ChurnRow& row = rows_[k];
    row.positions.push_back(static_cast<int64_t>(row.seq.size()) - 1);
    row.logits.push_back(l.to(at::kCPU));
    row.shown_by.push_back(index);
    if (std::find(touched_.begin(), touched_.end(), k) == touched_.end()) touched_.push_back(k);
  };
  auto token = [&](int64_t k) {
    return churn_token(k, static_cast<int64_t>(rows_[k].seq.size()), shape_.rows[k].rollbacks, vocab_);
  };
  const int64_t k = op.rows.empty() ? -1 : op.rows[0];
  using K = ChurnOp::Kind;
  switch (op.kind) {
    case K::Admit: {
      const int64_t row = static_cast<int64_t>(rows_.size());
      rows_.push_back({});
      for (int64_t p = 0; p < op.n; ++p) rows_[row].seq.push_back(churn_token(row, p, 0, vocab_));
      at::Tensor logits;
      ids_.push_back(target_.add_rows({rows_[row].seq}, logits)[0]);  // logits (1, V)
      show(row, logits[0]);
      break;
    }
    case K::Step:
      for (int64_t s = 0; s < op.n; ++s) {
        std::vector<int64_t> targets, ids;
        for (int64_t r : op.rows) {
          ids.push_back(token(r));
          rows_[r].seq.push_back(ids.back());
          targets.push_back(ids_[r]);
        }
        const at::Tensor out = target_.step_rows(targets, ids).to(at::kCPU);  // (R, V)
        for (size_t i = 0; i < op.rows.size(); ++i) show(op.rows[i], out[static_cast<int64_t>(i)]);
      }
      break;
    case K::Fork:
      ids_.push_back(target_.fork_row(ids_[k]));
      rows_.push_back(rows_[k]);  // the child's history is its parent's
      break;
    case K::Truncate: {
      target_.truncate_row(ids_[k], op.n);
      ChurnRow& row = rows_[k];
      row.seq.resize(row.seq.size() - static_cast<size_t>(op.n));
      // What was seen at a dropped position is no longer this row's; what was seen before stays.
      const int64_t last = static_cast<int64_t>(row.seq.size()) - 1;
      ChurnRow kept{row.seq, {}, {}, {}};
      for (size_t i = 0; i < row.positions.size(); ++i)
        if (row.positions[i] <= last) kept.positions.push_back(row.positions[i]), kept.logits.push_back(row.logits[i]), kept.shown_by.push_back(row.shown_by[i]);
      row = std::move(kept);
      break;
    }
    case K::Release: target_.release_row(ids_[k]); break;
    case K::Extend: {
      std::vector<int64_t> chunk;
      for (int64_t i = 0; i < op.n; ++i) chunk.push_back(token(k)), rows_[k].seq.push_back(chunk.back());
      show(k, target_.extend_row(ids_[k], chunk));
      break;
    }
  }
  shape_.apply(op);
  script_.push_back(op);
}

std::vector<ChurnOp> churn_plan(uint64_t seed, int64_t n, int64_t context, int64_t max_live, const ChurnOps& ops) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  ChurnShape shape;
  shape.context = context;
  shape.max_live = max_live;
  shape.past_window = ops.past_window;
  std::vector<ChurnOp> plan;
  using K = ChurnOp::Kind;
  for (int64_t tries = 0; static_cast<int64_t>(plan.size()) < n && tries < 100 * n; ++tries) {
    const std::vector<int64_t> live = shape.live_rows();
    // Weights: admit, step, fork, truncate, release, extend.
    const std::vector<double> w = {live.empty() ? 10.0 : live.size() < 3 ? 3.0 : 1.5, live.empty() ? 0.0 : 5.0,
                                   ops.fork ? 1.0 : 0.0, ops.truncate ? 1.0 : 0.0, live.size() > 1 ? 1.5 : 0.3, ops.extend ? 1.0 : 0.0};
    const auto kind = static_cast<K>(std::discrete_distribution<int>(w.begin(), w.end())(rng));
    ChurnOp op;
    op.kind = kind;
    if (kind == K::Admit) {
      // Mostly short prompts; some that end a few tokens before the window's edge, so a few steps
      // take their rows across it.
      op.n = uniform(0, 9) < 7 ? uniform(1, std::min<int64_t>(24, context)) : uniform(std::max<int64_t>(1, context - 24), std::max<int64_t>(1, context - 2));
    } else if (live.empty()) {
      continue;
    } else if (kind == K::Step) {
      for (int64_t r : live)
        if (uniform(0, 9) < 6) op.rows.push_back(r);
      if (op.rows.empty()) op.rows.push_back(live[uniform(0, static_cast<int64_t>(live.size()) - 1)]);
      op.n = uniform(1, 8);
    } else {
      op.rows = {live[uniform(0, static_cast<int64_t>(live.size()) - 1)]};
      op.n = kind == K::Truncate ? uniform(1, 6) : kind == K::Extend ? uniform(2, 12) : 1;
    }
    if (!shape.applicable(op)) continue;
    shape.apply(op);
    plan.push_back(op);
  }
  return plan;
}

ChurnVerdict churn_verdict(GPT& model, const ChurnRow& row, double tolerance) {
  ChurnVerdict v;
  if (row.positions.empty()) return v;
  std::vector<int64_t> full = row.seq;
  full.push_back(0);  // the newest logits predict a token not fed yet: any id, it is never read
  const auto dev = model->emb->weight.device();
  const at::Tensor seq = at::tensor(full, at::kLong).unsqueeze(0).to(dev);          // (1, L + 1)
  const StepReference ref = reference_for(model, seq, 1, seq.size(1) - 1);           // band: (1, L, V), index = position
  const at::Tensor idx = at::tensor(row.positions, at::kLong).to(ref.band.device());  // (m)
  const at::Tensor diff = (at::stack(row.logits, 0) - ref.band[0].index_select(0, idx).to(at::kCPU)).abs().amax(1);  // (m)
  v.worst = diff.max().item<double>();
  for (size_t i = 0; i < row.positions.size(); ++i) {
    const double d = diff[static_cast<int64_t>(i)].item<double>();
    if (!(d <= tolerance) && (v.first_over < 0 || row.positions[i] < v.first_over)) v.first_over = row.positions[i], v.diff_there = d;
  }
  return v;
}

void churn_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  ChurnOps ops;
  ops.fork = c.target.serving_unsupported("fork").empty();
  ops.truncate = c.target.serving_unsupported("truncate").empty();
  ops.extend = c.target.serving_unsupported("extend").empty();
  ops.past_window = c.opts.past_window;
  const std::vector<ChurnOp> plan = churn_plan(kChurnSeed, c.opts.serving_tokens > 0 ? kChurnShortOps : kChurnOps, ctx, kChurnLive, ops);
  ChurnRun run(c.target, V, ctx, kChurnLive, ops.past_window);
  // A target that shows wrong logits may also refuse a later operation (a row it has put at the
  // wrong position, say): what it showed before is judged first, then the refusal is the error.
  std::string refused;
  size_t done = 0;
  try {
    for (; done < plan.size(); ++done) run.apply(plan[done]);
  } catch (const std::exception& e) {
    refused = "operation " + std::to_string(done + 1) + " (`" + to_string(plan[done]) + "`) failed: " + e.what();
  }
  double worst = 0;
  int64_t past = 0, shown = 0;
  for (size_t k = 0; k < run.rows().size(); ++k) {
    const ChurnRow& row = run.rows()[k];
    const ChurnVerdict v = churn_verdict(c.model, row, c.tol().logits);
    worst = std::max(worst, v.worst);
    shown += static_cast<int64_t>(row.positions.size());
    past += std::count_if(row.positions.begin(), row.positions.end(), [&](int64_t p) { return p >= ctx; });
    if (v.first_over < 0) continue;
    const auto at = std::find(row.positions.begin(), row.positions.end(), v.first_over) - row.positions.begin();
    const int64_t op = row.shown_by[static_cast<size_t>(at)];
    std::string before;
    for (int64_t i = std::max<int64_t>(0, op - 4); i < op; ++i) before += "`" + to_string(plan[i]) + "`, ";
    r.figure = v.diff_there;
    return set_result(r, false, "row " + std::to_string(k) + " vs its sequence alone: position " + std::to_string(v.first_over) +
                                    " off by " + sci(v.diff_there) + " > " + sci(c.tol().logits) + ", shown by operation " +
                                    std::to_string(op + 1) + " of " + std::to_string(plan.size()) + " (`" + to_string(plan[op]) +
                                    "`, after " + before + "...; plan seed " + std::to_string(kChurnSeed) + ")" +
                                    (refused.empty() ? "" : "; then " + refused));
  }
  if (!refused.empty()) throw std::runtime_error("churn: " + refused);
  int64_t count[6] = {0, 0, 0, 0, 0, 0};
  for (const ChurnOp& op : plan) ++count[static_cast<int>(op.kind)];
  r.figure = worst;
  std::string skipped;
  if (!ops.fork) skipped += " fork";
  if (!ops.truncate) skipped += " truncate";
  if (!ops.extend) skipped += " extend";
  set_result(r, true, std::to_string(plan.size()) + " operations (" + std::to_string(count[0]) + " admissions, " + std::to_string(count[1]) +
                          " step runs, " + std::to_string(count[2]) + " forks, " + std::to_string(count[3]) + " rollbacks, " +
                          std::to_string(count[4]) + " releases, " + std::to_string(count[5]) + " extensions; seed " + std::to_string(kChurnSeed) +
                          (skipped.empty() ? "" : "; the target lacks" + skipped) + "): " + std::to_string(run.rows().size()) +
                          " rows equal their sequences alone at " + std::to_string(shown) + " positions, " + std::to_string(past) +
                          " past the window (worst |diff| " + sci(worst) + ")");
}

}  // namespace tinygpt::checks
