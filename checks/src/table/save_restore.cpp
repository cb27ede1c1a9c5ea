// save-restore: a row's state saved as an opaque value (llama.cpp's llama_state_seq_*, a server
// parking a conversation) and restored as a new row must continue exactly as the saved row would
// have: into another slot while other rows run, after a reset, and after churn (rows admitted and
// released around it); saved inside the window and past it, where a cache keeps fewer entries than
// the row has tokens (the bugs engines have had: a fragmented cache saved in part, a restored row
// that takes its position from its cache's length); and, where the target has one, into a second
// instance of it (an engine's second process: a state that refers to the saving process's memory
// instead of carrying the entries fails there). Each continuation is compared with the saved
// row's own logits at the same steps, and the saved row with the reference.
#include <ATen/ATen.h>

#include <algorithm>
#include <memory>

#include "rows.h"

namespace tinygpt::checks {

namespace {

constexpr int64_t kAfter = 16;  // steps each restored row continues

// How a restored row went on against the saved run: the largest |diff| and the step it peaks at,
// the first step over the bound (-1: none) and the |diff| there.
struct Continued {
  double worst = 0;
  int64_t worst_step = 0;
  int64_t first_over = -1;  // the first step over the bound that judged it; -1 when within
  double diff_there = 0;    // its |diff| (its KL when judged by the distribution)
  std::string why;          // the judge's reason when over
};

// Feeds `row` the saved run's tokens after step `from`, comparing its logits with the saved run's at
// the same steps, judged by the one judge at `t` (judge.h).
Continued continue_as(DecodeTarget& target, int64_t row, const RowRun& saved, int64_t from, const Tolerances& t) {
  std::vector<at::Tensor> got, want;
  for (int64_t j = 0; j < kAfter; ++j) {
    const int64_t id = saved.seq[static_cast<size_t>(saved.prompt + from + j)];
    got.push_back(target.serving().step_rows({row}, {id}).to(at::kCPU)[0]);  // (V): predicts the token after id
    want.push_back(saved.logits[static_cast<size_t>(from + j + 1)]);
  }
  const StepDiffs d = compare_steps(at::stack(got, 0).unsqueeze(0), at::stack(want, 0).unsqueeze(0), 0, t.logits);
  const Verdict v = judge(d, t);
  Continued out;
  out.worst = d.worst;
  out.worst_step = std::max<int64_t>(0, d.worst_position);
  if (!v.ok) {
    out.first_over = static_cast<int64_t>(v.first_over.value_or(0));
    out.diff_there = v.first_over ? v.at_first_over : d.worst;
    out.why = v.why;
  }
  return out;
}

}  // namespace

void save_restore_check(CheckContext& c, CheckResult& r) {
  const int64_t ctx = c.model->config().context;
  c.target.reset();
  // The saved row and a bystander decode together; the row is saved inside the window and far past
  // it, where its cache keeps fewer entries than it has tokens (the window and kRollbackEntries).
  std::vector<RowRun> runs;
  std::vector<LiveRow> live = admit(c, {row_prompt(c, 5, 0), row_prompt(c, 9, 1)}, runs);
  const int64_t prompt = runs[0].prompt;
  std::vector<int64_t> at = {24};
  // Not in shortened runs (the fault matrix's serving_tokens): a state saved in part shows inside the window.
  const bool far = c.opts.past_window && c.opts.serving_tokens == 0;
  if (far) at.push_back(ctx + kRollbackEntries + 24 - prompt);
  const int64_t total = at.back() + kAfter + 1;
  std::vector<std::string> states;
  for (int64_t i = 0; i < total; ++i) {
    if (std::find(at.begin(), at.end(), i) != at.end()) states.push_back(c.target.serving().save_row(live[0].id));
    step_all(c.target, live);
  }
  finish(live);
  double worst = 0;
  if (!judge_rows(c, r, {{"the saved row", &runs[0]}, {"the row beside it", &runs[1]}}, worst)) return;
  const RowRun& saved = runs[0];
  double parted = 0;  // the largest |diff| of a restored row from the saved one
  auto judge_on = [&](DecodeTarget& t, int64_t row, size_t k, const std::string& how) {
    const Continued went = continue_as(t, row, saved, at[k], c.tol());
    const double d = went.worst;
    const int64_t over = went.first_over;
    parted = std::max(parted, d);
    if (over < 0) return true;
    // Positions of the fed tokens, for a diagnosis: where it parts, by how much, where it peaks.
    const int64_t start = saved.prompt + at[k];
    r.stats["first_over"] = static_cast<double>(start + over);
    r.stats["first_over_diff"] = went.diff_there;
    r.stats["max_abs_diff"] = d;
    r.stats["worst_at"] = static_cast<double>(start + went.worst_step);
    for (const char* k : {"kl_mean", "kl_max", "top1_agreement"}) r.stats.erase(k);  // the saved row's, not these steps
    set_result(r, false, "restored " + how + " (saved after " + std::to_string(at[k]) + " steps, " +
                             (at[k] + prompt > ctx ? "past" : "inside") + " the window): " +
                             (c.tol().by_distribution() ? "against the saved row's own, " + went.why
                                                        : "step " + std::to_string(over + 1) + " after the restore differs from the saved "
                                                          "row's own by more than " + sci(c.tol().logits)) +
                             " (worst " + sci(d) + ")");
    r.figure = d;
    return false;
  };
  auto restored = [&](int64_t row, size_t k, const std::string& how) { return judge_on(c.target, row, k, how); };
  // Into another slot, while the saved row and its neighbour are still live.
  for (size_t k = 0; k < states.size(); ++k) {
    const int64_t row = c.target.serving().restore_row(states[k]);
    if (!restored(row, k, "beside live rows")) return;
    c.target.serving().release_row(row);
  }
  // After a reset: nothing left of the batch it was saved from.
  for (size_t k = 0; k < states.size(); ++k) {
    c.target.reset();
    if (!restored(c.target.serving().restore_row(states[k]), k, "after a reset")) return;
  }
  // After churn: rows admitted, stepped and released around it, so it lands in a freed slot that is
  // neither the first nor the last.
  for (size_t k = 0; k < states.size(); ++k) {
    c.target.reset();
    at::Tensor logits;
    const std::vector<int64_t> rows = c.target.serving().add_rows({row_prompt(c, 7, 2), row_prompt(c, 3, 3), row_prompt(c, 11, 4)}, logits);
    for (int s = 0; s < 4; ++s) c.target.serving().step_rows(rows, {1, 2, 3});
    c.target.serving().release_row(rows[1]);
    if (!restored(c.target.serving().restore_row(states[k]), k, "after churn")) return;
  }
  // Into a second instance of the target (an engine: a new process, a fresh context): a state must
  // carry everything, not refer to the memory of the process that saved it.
  const std::unique_ptr<DecodeTarget> second = c.target.offers().no_second_instance.empty() ? c.target.second_instance() : nullptr;
  if (second)
    for (size_t k = 0; k < states.size(); ++k) {
      second->reset();
      int64_t row = -1;
      try {
        row = second->serving().restore_row(states[k]);
      } catch (const CheckFailure& e) {  // a wrong answer fails the row; an engine gone errs (run_check)
        set_result(r, false, "restored into a second instance (saved after " + std::to_string(at[k]) +
                                 " steps): the restore failed: " + e.what());
        return;
      }
      if (!judge_on(*second, row, k, "into a second instance")) return;
    }
  r.figure = std::max(worst, parted);
  r.stats["restored_vs_saved"] = parted;
  std::string when = "after " + std::to_string(at[0]) + " steps";
  if (at.size() > 1) when += " and after " + std::to_string(at[1]) + " (past the window)";
  else when += c.opts.past_window ? " (not past the window in a shortened run)" : " (not past the window: " + c.opts.inside_window_why + ")";
  set_result(r, true, "saved " + when + ", restored beside live rows, after a reset, after churn" +
                          (second ? std::string(" and into a second instance") : std::string(" (no second instance of the target)")) +
                          ": each continues " +
                          std::to_string(kAfter) + " steps as the saved row did (largest |diff| " + sci(parted) +
                          "); the saved row equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

CheckDef save_restore_def() {
  return {check::kSaveRestore,
  "a row saved as a value inside and past the window, restored beside live rows, after a reset, after churn and "
  "into a second instance of the target (an engine's second process): each continues as the saved row did",
  save_restore_check, kServingRow | Tag::Long, Judge::Reference, {Op::Save}, Cost::Run,
  "a state saved in part, a restored row positioned by its cache's length, a restore into a slot not made fresh, a "
  "state that refers to the saving process's memory", 4};
}

}  // namespace tinygpt::checks
