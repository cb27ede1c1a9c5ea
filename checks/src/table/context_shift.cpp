// context-shift: llama.cpp's context shift. When a conversation fills the window, the server drops a
// span after the first n_keep tokens (seq_rm) and renumbers the later entries down by its length
// (seq_add), re-rotating their keys (the K-shift) instead of recomputing them. The row is filled to
// the window, shifted, decoded, and shifted and decoded twice more (llama.cpp's bug #4097: repeated
// shifts degrade), beside a row that is never shifted.
//
// A shifted row equals no plain sequence: its kept entries were computed beside the dropped tokens.
// Its reference is built from the uncached model's own per-layer keys and values of one forward of
// the row's tokens (never from a cache under test), the later keys re-rotated in double precision
// with RoPE's formula (SPEC 2), and decoded from there by the model's reference step. The largest
// difference after each shift is reported beside the verdict: an error that grows shift by shift
// shows, however far under the bound.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "reference_entries.h"
#include "rows.h"
#include "tinygpt/gpt.h"

namespace tinygpt::checks {

namespace {

constexpr int64_t kKeep = 4;     // entries kept at the start (llama-server's n_keep; the attention sink)
constexpr int64_t kShifts = 3;   // shifts in a row
constexpr int64_t kSteps = 32;   // decode steps after each shift (fewer on a small context)

struct Shift {
  int64_t at = 0;  // tokens the row had been fed when it was shifted
  int64_t keep = 0, discard = 0;
};

}  // namespace

void context_shift_check(CheckContext& c, CheckResult& r) {
  const Config& cfg = c.model->config();
  const int64_t V = cfg.vocab_size, ctx = cfg.context;
  const int64_t steps = serving_steps(c, std::min(kSteps, std::max<int64_t>(1, ctx / 4)));
  c.target.reset();
  // The shifted row is fed fixed ids, all different (a greedy run of a small model soon repeats
  // itself, and keys of one repeated token hide a wrong rotation): a prompt that fills the window,
  // then the ids of each phase. The row beside it decodes greedily.
  // An engine that keeps one sequence (max_rows 1: wllama) is shifted alone.
  const bool beside = c.target.offers().takes(2);
  std::vector<RowRun> runs;
  std::vector<std::vector<int64_t>> prompts = {serving_prompt(ctx, 0, V)};
  if (beside) prompts.push_back(row_prompt(c, 9, 1));
  std::vector<LiveRow> live = admit(c, prompts, runs);
  runs[0].logits.push_back(live[0].next);  // the full window's logits: runs[0] is the row before its first shift
  std::vector<int64_t> fed(runs[0].seq);   // every id the shifted row was fed, the dropped ones too
  int64_t next = ctx;                      // the shifted row's next position
  auto bystander_steps = [&] { return beside && (c.opts.past_window || static_cast<int64_t>(runs[1].seq.size()) < ctx); };
  // One step of the shifted row with `id` (and of the bystander while it may): the shifted row's logits (V).
  auto step = [&](int64_t id) {
    std::vector<int64_t> rows = {live[0].id}, ids = {id};
    const bool both = bystander_steps();
    if (both) {
      runs[1].logits.push_back(live[1].next);
      runs[1].seq.push_back(top1(live[1].next));
      rows.push_back(live[1].id), ids.push_back(runs[1].seq.back());
    }
    fed.push_back(id);
    const at::Tensor out = c.target.serving().step_rows(rows, ids).to(at::kCPU);  // (R, V)
    if (both) live[1].next = out[1].clone();
    ++next;
    return out[0].clone();
  };

  // The reference: the model's own entries of one forward of the row's tokens so far, shifted by hand
  // as the row is and decoded by the model's reference step, fed what the row was fed (after each
  // shift, the steps' ids in one chunk). The steps after each shift are judged before the next shift,
  // so a fault shows at the shift that exposed it.
  at::NoGradGuard no_grad;
  const auto dev = c.opts.prompt.device();
  ReferenceEntries ref(cfg);
  c.model->step(at::tensor(fed, at::kLong).unsqueeze(0).to(dev), ref, 0);  // (1, ctx): the row's window
  int64_t pos = next;
  const double bound = c.tol().logits;
  std::vector<double> per_shift, kl_per_shift;  // each shift's largest |diff|, and its mean KL when judged by one
  std::vector<Shift> shifts;
  // A held-out run (--vary N) keeps 4 to 8 entries: the shift points move.
  const int64_t keep = kKeep + static_cast<int64_t>(c.opts.variation % 5);
  for (int64_t k = 0; k < kShifts; ++k) {
    int64_t discard = (next - keep) / 2;  // llama-server's n_discard: half of what is not kept
    // A sliding layer (SPEC 10) keeps only its window: the shifted row must still be at least w - 1
    // past the kept entries, or its next query would need entries the layer no longer holds.
    if (cfg.has_sliding()) discard = std::min(discard, next - (keep + cfg.sliding_window - 1));
    if (discard < 1) break;
    shifts.push_back({static_cast<int64_t>(fed.size()), keep, discard});
    c.target.serving().shift_row(live[0].id, keep, discard);
    ref.shift(keep, discard);
    next -= discard, pos -= discard;
    const std::vector<int64_t> ids = row_ids(c, steps, 2 + k);
    std::vector<at::Tensor> gots;  // (V) each
    for (int64_t j = 0; j < steps; ++j) gots.push_back(step(ids[static_cast<size_t>(j)]));
    // The same ids through the reference's entries in one chunk: every position's logits.
    const at::Tensor wants = c.model->step_every(at::tensor(ids, at::kLong).unsqueeze(0).to(dev), ref, pos).to(at::kCPU)[0];  // (steps, V)
    // The shift's steps judged together by the one judge (judge.h): their largest |diff| against the
    // bound, or (an approximate target, --max-kl / --min-top1) their mean KL and top-1 agreement.
    const int64_t first = pos;  // the position the shift's first step predicts from
    const StepDiffs d = compare_steps(at::stack(gots, 0).unsqueeze(0), wants.unsqueeze(0), first, bound);  // per step
    const Verdict v = judge(d, c.tol());
    pos += steps;
    const std::string which = "after shift " + std::to_string(k + 1) + " (keep " + std::to_string(keep) + ", drop " + std::to_string(discard);
    if (!v.ok && c.tol().by_distribution()) {
      set_result(r, false, which + "): " + v.why + ", from the re-rotated reference over " + std::to_string(steps) + " steps");
      r.figure = d.kl_mean();
      r.stats["first_over"] = static_cast<double>(first + static_cast<int64_t>(v.first_over.value_or(0)));
      return;
    }
    if (!v.ok) {
      const size_t j = *v.first_over;
      set_result(r, false, which + " of " + std::to_string(shifts.back().at) + " tokens), step " + std::to_string(j + 1) + ": |diff| " +
                               sci(d.diffs[j]) + " from the re-rotated reference > " + sci(bound));
      r.figure = d.diffs[j];
      r.stats["first_over"] = static_cast<double>(first + static_cast<int64_t>(j));  // the position of the token whose logits parted
      r.stats["first_over_diff"] = d.diffs[j];
      // How the error goes on over this shift's steps, for a diagnosis: its worst, where, its mean KL.
      r.stats["max_abs_diff"] = d.worst;
      r.stats["worst_at"] = static_cast<double>(d.worst_position);
      r.stats["kl_mean"] = d.kl_mean();
      return;
    }
    if (c.tol().by_distribution()) {
      r.stats["kl_after_shift_" + std::to_string(k + 1)] = d.kl_mean();
      kl_per_shift.push_back(d.kl_mean());
    }
    const double w = d.worst;
    per_shift.push_back(w);
    r.stats["after_shift_" + std::to_string(k + 1)] = w;
  }
  double worst = 0;
  // Before the first shift the row is a plain sequence; the bystander is one throughout.
  std::vector<std::pair<std::string, const RowRun*>> plain = {{"the row before its first shift", &runs[0]}};
  if (beside) plain.emplace_back("the row beside it (never shifted)", &runs[1]);
  if (!judge_rows(c, r, plain, worst)) return;
  if (shifts.empty()) {
    set_result(r, true, "the window (" + std::to_string(ctx) + ") leaves nothing to shift after keeping " + std::to_string(keep));
    return;
  }
  // What each shift was judged by: its mean KL where the target is (an engine answering log-probabilities
  // is off by a constant per step, its |diff| meaningless), else its largest |diff|.
  const bool by_kl = !kl_per_shift.empty();
  const std::vector<double>& judged = by_kl ? kl_per_shift : per_shift;
  std::string each;
  for (size_t k = 0; k < judged.size(); ++k)
    each += (k ? ", " : "") + std::to_string(shifts[k].discard) + " dropped: " + sci(judged[k]);
  r.figure = by_kl ? *std::max_element(judged.begin(), judged.end()) : std::max(worst, *std::max_element(per_shift.begin(), per_shift.end()));
  set_result(r, true, std::to_string(shifts.size()) + " shifts of a full window, keeping " + std::to_string(keep) + ", " +
                          std::to_string(steps) + " steps after each; " +
                          (by_kl ? "mean KL" : "largest |diff|") + " from the re-rotated reference after each (" +
                          each + "); " + (beside ? "the row beside it and " : "") +
                          "the row before its shift equal their sequences alone (" + (by_kl ? std::string("by mean KL") : "worst " + sci(worst)) + ")" +
                          (beside ? "" : "; no row beside it: the target keeps one sequence"));
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

CheckDef context_shift_def() {
  return {check::kContextShift,
  "a row that fills the window shifted " + std::to_string(kShifts) + " times (the entries after the first " + std::to_string(kKeep) +
  " halved, the later ones renumbered and their keys re-rotated), " + std::to_string(kSteps) + " steps after each: equals the uncached model's own keys and values shifted by "
  "RoPE's formula, the error after each shift reported",
  context_shift_check, Tag::Serving | Tag::Long, Judge::Reference, {Op::Ragged, Op::Shift}, Cost::Run,
  "kept keys not re-rotated, a row's position not moved down, a re-rotation whose error grows with each shift"};
}

}  // namespace tinygpt::checks
