// churn: a seeded plan of serving operations on one target, every row judged against its own
// sequence alone at the end (churn.h). The plan, the run and the verdict are public so the
// RapidCheck property can drive the same operations with rc::state and shrink a failure.
#include "tinygpt/checks/churn.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "reference_entries.h"
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
    case ChurnOp::Kind::Shift: return "shift " + row + " keep " + std::to_string(op.keep) + " drop " + std::to_string(op.n);
    case ChurnOp::Kind::Save: return "save " + row;
    case ChurnOp::Kind::Restore: return "restore " + std::to_string(op.n);
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
  if (op.kind == K::Restore) return op.rows.empty() && op.n >= 0 && op.n < static_cast<int64_t>(saved.size()) && live() < max_live;
  if (op.rows.empty()) return false;
  if (op.kind == K::Step) {
    std::vector<int64_t> sorted = op.rows;
    std::sort(sorted.begin(), sorted.end());
    if (op.n < 1 || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || !std::all_of(sorted.begin(), sorted.end(), is_live))
      return false;
    return std::all_of(sorted.begin(), sorted.end(),
                       [&](int64_t k) { return (ops.past_window && !rows[k].shifted) || rows[k].next + op.n <= context; });
  }
  if (op.rows.size() != 1 || !is_live(op.rows[0])) return false;
  const Row& r = rows[op.rows[0]];
  switch (op.kind) {
    case K::Fork: return ops.has(Op::Fork) && live() < max_live;
    case K::Release: return true;
    // SPEC 4's window after a rollback is over the sequence that remains: the cache must still hold it.
    case K::Truncate:
      return ops.has(Op::Truncate) && op.n >= 1 && op.n < r.next && r.stored - op.n >= std::min(r.next - op.n, context) &&
             (sliding == 0 || r.local - op.n >= std::min(r.next - op.n, sliding - 1));
    case K::Extend: return ops.has(Op::Extend) && op.n >= 1 && r.next + op.n <= context;  // a chunk ends inside the window
    case K::Shift:
      return ops.has(Op::Shift) && op.keep >= 0 && op.n >= 1 && op.keep + op.n < r.next && r.next <= context && r.stored == r.next &&
             sliding_keeps(r, op.keep, op.n);
    case K::Save: return ops.has(Op::Save);
    default: return false;
  }
}

bool ChurnShape::sliding_keeps(const Row& r, int64_t keep, int64_t n) const {
  if (sliding == 0) return true;
  const int64_t after = r.next - n, need = std::min(after, sliding - 1), oldest = after - need;
  return need == 0 || (oldest < keep ? oldest : oldest + n) >= r.next - r.local;
}

void ChurnShape::apply(const ChurnOp& op) {
  if (!applicable(op)) throw std::logic_error("churn: '" + to_string(op) + "' does not apply here");
  const int64_t keep = context + kRollbackEntries, local_keep = sliding > 0 ? sliding - 1 + kRollbackEntries : 0;
  auto feed = [&](Row& r, int64_t n) {
    r.next += n, r.stored = std::min(r.stored + n, keep);
    r.local = std::min(r.local + n, local_keep);
  };
  using K = ChurnOp::Kind;
  switch (op.kind) {
    case K::Admit:
      rows.push_back({true, op.n, op.n, 0});
      rows.back().local = std::min(op.n, local_keep);
      break;
    case K::Step:
      for (int64_t r : op.rows) feed(rows[r], op.n);
      break;
    case K::Fork: rows.push_back(rows[op.rows[0]]); break;
    case K::Truncate: {
      Row& r = rows[op.rows[0]];
      r.next -= op.n, r.stored -= op.n, r.local -= op.n, ++r.rollbacks;
      break;
    }
    case K::Release: rows[op.rows[0]].live = false; break;
    case K::Extend: feed(rows[op.rows[0]], op.n); break;
    case K::Shift: {
      Row& r = rows[op.rows[0]];
      // A sliding layer keeps the shifted row from the first position it held (RowBatch::shift).
      const int64_t lo = r.next - r.local, q0 = lo <= op.keep ? lo : lo <= op.keep + op.n ? op.keep : lo - op.n;
      r.next -= op.n, r.stored -= op.n, ++r.rollbacks, r.shifted = true;
      r.local = std::min(r.next - q0, local_keep);
      break;
    }
    case K::Save: saved.push_back(rows[op.rows[0]]); break;
    case K::Restore: rows.push_back(saved[static_cast<size_t>(op.n)]), rows.back().live = true; break;
  }
}

ChurnRun::ChurnRun(DecodeTarget& target, GPT& model, int64_t max_live, const ChurnOps& ops)
    : target_(target), model_(model), vocab_(model->config().vocab_size) {
  shape_.context = model->config().context;
  shape_.sliding = model->config().has_sliding() ? model->config().sliding_window : 0;
  shape_.max_live = max_live;
  shape_.ops = ops;
  target_.reset();
}

ChurnRun::~ChurnRun() = default;

void ChurnRun::reference_feed(int64_t k, const std::vector<int64_t>& ids) {
  Pending& p = pending_[static_cast<size_t>(k)];
  p.ids.insert(p.ids.end(), ids.begin(), ids.end());
  p.shown.emplace_back(static_cast<int64_t>(p.ids.size()) - 1, rows_[static_cast<size_t>(k)].expected.size() - 1);
}

void ChurnRun::settle(int64_t k) {
  Pending& p = pending_[static_cast<size_t>(k)];
  if (p.ids.empty()) return;
  at::NoGradGuard no_grad;
  ReferenceEntries& e = *entries_[static_cast<size_t>(k)];
  const at::Tensor x = at::tensor(p.ids, at::kLong).unsqueeze(0).to(model_->emb->weight.device());  // (1, n)
  const at::Tensor l = model_->step_every(x, e, e.length()).to(at::kCPU)[0];                      // (n, V)
  for (const auto& [i, where] : p.shown) rows_[static_cast<size_t>(k)].expected[where] = l[i];
  p = {};
}

const std::vector<ChurnRow>& ChurnRun::rows() {
  for (size_t k = 0; k < rows_.size(); ++k) settle(static_cast<int64_t>(k));
  return rows_;
}

namespace {

// The band reference's logits (m, V) at `positions` of `seq` (position p predicts seq[p + 1]).
at::Tensor sequence_reference(GPT& model, const std::vector<int64_t>& seq, const std::vector<int64_t>& positions) {
  std::vector<int64_t> full = seq;
  full.push_back(0);  // the newest logits predict a token not fed yet: any id, it is never read
  const auto dev = model->emb->weight.device();
  const at::Tensor s = at::tensor(full, at::kLong).unsqueeze(0).to(dev);  // (1, L + 1)
  const StepReference ref = reference_for(model, s, 1, s.size(1) - 1);   // band: (1, L, V), index = position
  return ref.band[0].index_select(0, at::tensor(positions, at::kLong).to(ref.band.device())).to(at::kCPU);  // (m, V)
}

// The reference of each logits `row` showed (V each): the recorded one where there is one (a shifted
// row's), else the band reference of its sequence at that position.
std::vector<at::Tensor> references_of(GPT& model, const ChurnRow& row) {
  std::vector<int64_t> pending;
  for (size_t i = 0; i < row.positions.size(); ++i)
    if (!row.expected[i].defined()) pending.push_back(row.positions[i]);
  const at::Tensor band = pending.empty() ? at::Tensor() : sequence_reference(model, row.seq, pending);  // (m, V)
  std::vector<at::Tensor> want;
  int64_t j = 0;
  for (size_t i = 0; i < row.positions.size(); ++i) want.push_back(row.expected[i].defined() ? row.expected[i] : band[j++]);
  return want;
}

}  // namespace

void ChurnRun::apply(const ChurnOp& op) {
  if (!shape_.applicable(op)) throw std::logic_error("churn: '" + to_string(op) + "' does not apply here");
  const int64_t index = static_cast<int64_t>(script_.size());
  touched_.clear();
  // l (V): logits at the row's newest position; want (V): the reference's there (a shifted row's) or undefined.
  auto show = [&](int64_t k, const at::Tensor& l, const at::Tensor& want = at::Tensor()) {
    ChurnRow& row = rows_[k];
    row.positions.push_back(static_cast<int64_t>(row.seq.size()) - 1);
    row.logits.push_back(l.to(at::kCPU));
    row.shown_by.push_back(index);
    row.expected.push_back(want);
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
      ids_.push_back(target_.serving().add_rows({rows_[row].seq}, logits)[0]);  // logits (1, V)
      entries_.push_back(nullptr);
      pending_.emplace_back();
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
        const at::Tensor out = target_.serving().step_rows(targets, ids).to(at::kCPU);  // (R, V)
        for (size_t i = 0; i < op.rows.size(); ++i) {
          const int64_t r = op.rows[i];
          show(r, out[static_cast<int64_t>(i)]);
          if (entries_[r]) reference_feed(r, {ids[i]});
        }
      }
      break;
    case K::Fork:
      if (entries_[k]) settle(k);
      ids_.push_back(target_.serving().fork_row(ids_[k]));
      rows_.push_back(rows_[k]);  // the child's history is its parent's
      entries_.push_back(entries_[k] ? std::make_shared<ReferenceEntries>(entries_[k]->copy()) : nullptr);
      pending_.emplace_back();
      break;
    case K::Truncate: {
      if (entries_[k]) settle(k);
      target_.serving().truncate_row(ids_[k], op.n);
      ChurnRow& row = rows_[k];
      row.seq.resize(row.seq.size() - static_cast<size_t>(op.n));
      // What was seen at a dropped position is no longer this row's; what was seen before stays.
      // (Logits judged against a shifted row's entries were judged at the point they were shown: kept.)
      const int64_t last = static_cast<int64_t>(row.seq.size()) - 1;
      ChurnRow kept{row.seq, {}, {}, {}, {}, row.history};
      for (size_t i = 0; i < row.positions.size(); ++i)
        if (row.positions[i] <= last || row.expected[i].defined()) {
          kept.positions.push_back(row.positions[i]), kept.logits.push_back(row.logits[i]);
          kept.shown_by.push_back(row.shown_by[i]), kept.expected.push_back(row.expected[i]);
        }
      row = std::move(kept);
      if (entries_[k]) entries_[k]->drop_newest(op.n);
      break;
    }
    case K::Release: target_.serving().release_row(ids_[k]); break;
    case K::Extend: {
      std::vector<int64_t> chunk;
      for (int64_t i = 0; i < op.n; ++i) chunk.push_back(token(k)), rows_[k].seq.push_back(chunk.back());
      const at::Tensor got = target_.serving().extend_row(ids_[k], chunk);  // (V)
      show(k, got);
      if (entries_[k]) reference_feed(k, chunk);
      break;
    }
    case K::Shift: {
      if (entries_[k]) settle(k);
      target_.serving().shift_row(ids_[k], op.keep, op.n);
      ChurnRow& row = rows_[k];
      if (!entries_[k]) {
        // The row's first shift: what it showed so far is judged against its sequence alone now,
        // and its reference from here on is the model's own entries of one forward of it, shifted.
        row.expected = references_of(model_, row);
        at::NoGradGuard no_grad;
        entries_[k] = std::make_shared<ReferenceEntries>(model_->config());
        const at::Tensor x = at::tensor(row.seq, at::kLong).unsqueeze(0).to(model_->emb->weight.device());  // (1, L)
        model_->step(x, *entries_[k], 0);
      }
      entries_[k]->shift(op.keep, op.n);
      row.seq.erase(row.seq.begin() + op.keep, row.seq.begin() + op.keep + op.n);
      break;
    }
    case K::Save:
      if (entries_[k]) settle(k);
      saved_.push_back({target_.serving().save_row(ids_[k]), rows_[k],
                        entries_[k] ? std::make_shared<ReferenceEntries>(entries_[k]->copy()) : nullptr});
      break;
    case K::Restore: {
      const Saved& sv = saved_[static_cast<size_t>(op.n)];
      ids_.push_back(target_.serving().restore_row(sv.state));
      rows_.push_back(sv.row);
      entries_.push_back(sv.entries ? std::make_shared<ReferenceEntries>(sv.entries->copy()) : nullptr);
      pending_.emplace_back();
      break;
    }
  }
  // The operation is in the history of every row it named or made.
  if (op.kind == K::Admit || op.kind == K::Fork || op.kind == K::Restore) rows_.back().history.push_back(index);
  if (op.kind != K::Admit && op.kind != K::Restore)
    for (int64_t r : op.rows) rows_[static_cast<size_t>(r)].history.push_back(index);
  shape_.apply(op);
  script_.push_back(op);
}

std::vector<ChurnOp> churn_plan(uint64_t seed, int64_t n, int64_t context, int64_t max_live, const ChurnOps& ops) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  ChurnShape shape;
  shape.context = context;
  shape.max_live = max_live;
  shape.ops = ops;
  std::vector<ChurnOp> plan;
  using K = ChurnOp::Kind;
  for (int64_t tries = 0; static_cast<int64_t>(plan.size()) < n && tries < 100 * n; ++tries) {
    const std::vector<int64_t> live = shape.live_rows();
    // Weights: admit, step, fork, truncate, release, extend, shift, save, restore.
    const std::vector<double> w = {live.empty() ? 10.0 : live.size() < 3 ? 3.0 : 1.5, live.empty() ? 0.0 : 5.0,
                                   ops.has(Op::Fork) ? 1.0 : 0.0, ops.has(Op::Truncate) ? 1.0 : 0.0, live.size() > 1 ? 1.5 : 0.3, ops.has(Op::Extend) ? 1.0 : 0.0,
                                   ops.has(Op::Shift) ? 0.8 : 0.0, ops.has(Op::Save) ? 0.4 : 0.0, ops.has(Op::Save) && !shape.saved.empty() ? 1.0 : 0.0};
    const auto kind = static_cast<K>(std::discrete_distribution<int>(w.begin(), w.end())(rng));
    ChurnOp op;
    op.kind = kind;
    if (kind == K::Restore) {
      op.n = uniform(0, static_cast<int64_t>(shape.saved.size()) - 1);
    } else if (kind == K::Admit) {
      // Mostly short prompts; some that end a few tokens before the window's edge, so a few steps
      // take their rows across it.
      op.n = uniform(0, 9) < 7 ? uniform(1, std::min<int64_t>(24, context)) : uniform(std::max<int64_t>(1, context - 24), std::max<int64_t>(1, context - 2));
    } else if (live.empty()) {
      continue;
    } else if (kind == K::Step) {
      for (int64_t r : live)
        if (uniform(0, 9) < 6) op.rows.push_back(r);
      if (op.rows.empty()) op.rows.push_back(live[uniform(0, static_cast<int64_t>(live.size()) - 1)]);
      op.n = uniform(1, 4);
    } else {
      op.rows = {live[uniform(0, static_cast<int64_t>(live.size()) - 1)]};
      op.n = kind == K::Truncate ? uniform(1, 6) : kind == K::Extend ? uniform(2, 12) : 1;
      if (kind == K::Shift) {  // keep a few (llama-server's n_keep), drop up to half of the rest
        const int64_t next = shape.rows[static_cast<size_t>(op.rows[0])].next;
        op.keep = uniform(0, 8);
        op.n = uniform(1, std::max<int64_t>(1, (next - op.keep) / 2));
      }
    }
    if (!shape.applicable(op)) continue;
    shape.apply(op);
    plan.push_back(op);
  }
  return plan;
}

ChurnVerdict churn_verdict(GPT& model, const ChurnRow& row, const Tolerances& t) {
  ChurnVerdict v;
  if (row.positions.empty()) return v;
  // What was shown while the row was a plain sequence, against the band reference of it; the rest
  // against the reference's shifted entries, as recorded.
  const std::vector<at::Tensor> want = references_of(model, row);
  // Each shown position as a step of one row: |diff| and KL per position.
  const StepDiffs d = compare_steps(at::stack(row.logits, 0).unsqueeze(0), at::stack(want, 0).unsqueeze(0), 0, t.logits);
  v.worst = *std::max_element(d.diffs.begin(), d.diffs.end());
  v.kl_mean = d.kl_mean();
  const Verdict j = judge(d, t);
  v.ok = j.ok;
  v.why = j.why;
  if (j.ok) return v;
  size_t i = 0;
  if (j.first_over) i = *j.first_over;
  else if (d.first_top1_parting) i = static_cast<size_t>(*d.first_top1_parting);
  v.index = static_cast<int64_t>(i), v.first_over = row.positions[i];
  v.diff_there = j.by_kl || !j.first_over ? d.kl[i] : d.diffs[i];
  return v;
}

ChurnOps churn_ops_of(const DecodeTarget& t, bool past_window) {
  ChurnOps ops;
  Ops offered;
  ChurnOps{}.offered.each([&](Op op) {
    if (t.offers().why_not(op).empty()) offered = offered.with(op);
  });
  ops.offered = offered;
  ops.past_window = past_window;
  return ops;
}

// What a failing churn row's first divergence followed (churn.h, ChurnSignature).
ChurnSignature churn_signature(const std::vector<ChurnOp>& plan, const ChurnRow& row, const ChurnVerdict& v) {
  using K = ChurnOp::Kind;
  ChurnSignature s;
  const size_t at = static_cast<size_t>(v.index);
  const int64_t shown = row.shown_by[at], last_right = at > 0 ? row.shown_by[at - 1] : -1;
  int64_t dropped = 0;  // entries shifts dropped from the row before then: the request's frame is the engine's plus these
  int64_t last = -1;    // the row's last operation other than a step, at or before `shown`
  for (int64_t i : row.history) {
    if (i > shown) break;
    const ChurnOp& op = plan[static_cast<size_t>(i)];
    if (op.kind == K::Shift) dropped += op.n;
    if (op.kind == K::Step) continue;
    last = i;
    if (i > last_right) s.ops.push_back(i);  // between the row's last right logits and its first wrong ones
  }
  if (s.ops.empty() && last >= 0) s.ops.push_back(last);  // only steps between: the last operation before them
  for (int64_t i : s.ops) {
    const ChurnOp& op = plan[static_cast<size_t>(i)];
    const bool released_before = std::any_of(plan.begin(), plan.begin() + i, [](const ChurnOp& o) { return o.kind == K::Release; });
    std::string name, entries;
    switch (op.kind) {
      case K::Admit: name = released_before ? "release + admit" : "admit"; entries = released_before ? "in a released row's slot" : "the prompt's"; break;
      case K::Fork: name = "fork"; entries = "copied from the parent"; break;
      case K::Truncate: name = "truncate"; entries = "a rollback kept or brought back"; break;
      case K::Extend: name = "extend"; entries = "of the new chunk"; break;
      case K::Shift: name = "shift"; entries = "shifted"; break;
      case K::Save: name = "save"; entries = "saved"; break;
      case K::Restore: name = "restore"; entries = "restored"; break;
      case K::Release: name = "release"; entries = "of a released row"; break;
      case K::Step: break;
    }
    s.kinds.push_back(name);
    s.entries.push_back(entries);
  }
  // The row's positions shown from the first of them on, up to the first divergence: 0 when the first
  // logits after it (or its own) already part.
  for (size_t i = 0; i < at; ++i)
    if (!s.ops.empty() && row.shown_by[i] >= s.ops.front()) ++s.shown_after;
  s.position_engine = v.first_over;
  s.position_request = v.first_over + dropped;
  return s;
}

std::string ChurnSignature::kinds_text() const {
  std::vector<std::string> k = kinds;
  std::sort(k.begin(), k.end());
  k.erase(std::unique(k.begin(), k.end()), k.end());
  std::string out;
  for (const auto& x : k) out += (out.empty() ? "" : ",") + x;
  return out;
}

std::string ChurnSignature::text(const std::vector<ChurnOp>& plan) const {
  std::string out;
  for (size_t i = 0; i < ops.size(); ++i)
    out += (i ? ", then " : "") + kinds[i] + " (operation " + std::to_string(ops[i] + 1) + ", `" + to_string(plan[static_cast<size_t>(ops[i])]) +
           "`; entries " + entries[i] + ")";
  if (out.empty()) return "no operation but steps";
  return out + ", " + (shown_after == 0 ? "at the first logits after it" : std::to_string(shown_after) + " logits after it");
}

void churn_check(CheckContext& c, CheckResult& r) {
  const int64_t ctx = c.model->config().context;
  const ChurnOps ops = churn_ops_of(c.target, c.opts.past_window);
  const uint64_t seed = kChurnSeed + c.opts.variation;
  const std::vector<ChurnOp> plan = churn_plan(seed, c.opts.serving_tokens > 0 ? kChurnShortOps : kChurnOps, ctx, kChurnLive, ops);
  ChurnRun run(c.target, c.model, kChurnLive, ops);
  // A target that shows wrong logits may also refuse a later operation (a row it has put at the
  // wrong position, say): what it showed before is judged first, then the refusal is the error.
  // A refusal is judged as every row judges one (check_suite.h: CheckFailure): an answer that is wrong
  // (an engine's `ok: false` to a valid request) fails the row; anything else (the engine gone) errs.
  std::string refused;
  bool wrong_answer = false;
  size_t done = 0;
  try {
    for (; done < plan.size(); ++done) run.apply(plan[done]);
  } catch (const CheckFailure& e) {
    refused = "operation " + std::to_string(done + 1) + " (`" + to_string(plan[done]) + "`) failed: " + e.what();
    wrong_answer = true;
  } catch (const std::exception& e) {
    refused = "operation " + std::to_string(done + 1) + " (`" + to_string(plan[done]) + "`) failed: " + e.what();
  }
  double worst = 0;
  int64_t past = 0, shown = 0;
  // The row that parted first in the run (the earliest operation showing a divergence; the lowest row
  // number on a tie): where the bug first showed, whichever rows it reached later.
  std::optional<size_t> first;
  ChurnVerdict first_v;
  for (size_t k = 0; k < run.rows().size(); ++k) {
    const ChurnRow& row = run.rows()[k];
    const ChurnVerdict v = churn_verdict(c.model, row, c.tol());
    worst = std::max(worst, v.worst);
    shown += static_cast<int64_t>(row.positions.size());
    past += std::count_if(row.positions.begin(), row.positions.end(), [&](int64_t p) { return p >= ctx; });
    if (!v.ok && (!first || row.shown_by[static_cast<size_t>(v.index)] < run.rows()[*first].shown_by[static_cast<size_t>(first_v.index)]))
      first = k, first_v = v;
  }
  if (first) {
    const size_t k = *first;
    const ChurnRow& row = run.rows()[k];
    const ChurnVerdict& v = first_v;
    const int64_t op = row.shown_by[static_cast<size_t>(v.index)];
    // The row's own history up to there (its parent's or saved row's included), the last 8 of it.
    std::vector<int64_t> mine;
    for (int64_t i : row.history)
      if (i < op) mine.push_back(i);
    std::string before;
    for (size_t i = mine.size() > 8 ? mine.size() - 8 : 0; i < mine.size(); ++i)
      before += std::to_string(mine[i] + 1) + " `" + to_string(plan[static_cast<size_t>(mine[i])]) + "`, ";
    // And the operations just before it, whichever rows they named (a fork's child shares cells).
    std::string just;
    for (int64_t i = std::max<int64_t>(0, op - 3); i < op; ++i) just += std::to_string(i + 1) + " `" + to_string(plan[static_cast<size_t>(i)]) + "`, ";
    const ChurnSignature sig = churn_signature(plan, row, v);
    r.figure = v.diff_there;
    r.stats["first_over"] = static_cast<double>(sig.position_request);  // the request's frame (a shift renumbers the engine's)
    if (sig.position_engine != sig.position_request) r.stats["first_over_engine"] = static_cast<double>(sig.position_engine);
    r.stats["first_over_diff"] = v.diff_there;
    r.stats["max_abs_diff"] = v.worst;
    // What a diagnosis matches by (diagnose.h): the operation the divergence followed, not its position.
    r.labels["op"] = sig.kinds_text();
    r.labels["followed"] = sig.text(plan);
    if (!sig.ops.empty()) r.stats["op_index"] = static_cast<double>(sig.ops.front() + 1);
    r.stats["shown_after_op"] = static_cast<double>(sig.shown_after);
    const std::string off = c.tol().by_distribution() ? v.why + " (first shown there at position " + std::to_string(v.first_over) + ")"
                                                      : "position " + std::to_string(v.first_over) + " off by " + sci(v.diff_there) + " > " +
                                                            sci(c.tol().logits);
    return set_result(r, false, "row " + std::to_string(k) + " vs its sequence alone: " + off + ", shown by operation " +
                                    std::to_string(op + 1) + " of " + std::to_string(plan.size()) + " (`" + to_string(plan[op]) +
                                    "`; the row's history before it: " + (mine.size() > 8 ? "..., " : "") + before + "the last operations before it: " + just + "plan seed " + std::to_string(seed) + "; it followed " + sig.text(plan) + ")" +
                                    (refused.empty() ? "" : "; then " + refused));
  }
  if (wrong_answer) throw CheckFailure("churn: " + refused);
  if (!refused.empty()) throw std::runtime_error("churn: " + refused);
  int64_t count[ChurnOp::kKinds] = {};
  for (const ChurnOp& op : plan) ++count[static_cast<int>(op.kind)];
  r.figure = worst;
  std::string skipped;
  ChurnOps{}.offered.each([&](Op op) {
    if (!ops.has(op)) skipped += std::string(" ") + op_name(op);
  });
  set_result(r, true, std::to_string(plan.size()) + " operations (" + std::to_string(count[0]) + " admissions, " + std::to_string(count[1]) +
                          " step runs, " + std::to_string(count[2]) + " forks, " + std::to_string(count[3]) + " rollbacks, " +
                          std::to_string(count[4]) + " releases, " + std::to_string(count[5]) + " extensions, " + std::to_string(count[6]) + " shifts, " +
                          std::to_string(count[7]) + " saves, " + std::to_string(count[8]) + " restores; seed " + std::to_string(seed) +
                          (skipped.empty() ? "" : "; the target lacks" + skipped) + "): " + std::to_string(run.rows().size()) +
                          " rows equal their sequences alone at " + std::to_string(shown) + " positions, " + std::to_string(past) +
                          " past the window (worst |diff| " + sci(worst) + ")");
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

CheckDef churn_def() {
  return {check::kChurn,
  "a seeded plan of " + std::to_string(kChurnOps) + " operations (admit, step, fork, rollback, extend, context shift, save, "
  "restore, release; up to " + std::to_string(kChurnLive) + " rows live): every row, live or gone, equals its sequence alone (a shifted row: the model's own entries "
  "shifted the same way) at every position it showed",
  churn_check, kServingRow | Tag::Long, Judge::Reference, {Op::Join}, Cost::Run,
  "cache-layout bugs that need churn: a slot freed out of order, a position kept by request instead of by row, a "
  "released row's entries left visible, a shift that moves entries another row still shares", kChurnLive};
}

}  // namespace tinygpt::checks
