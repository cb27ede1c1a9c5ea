// rollback-after-restore: a row saved past the window, restored, then rolled back across the window's
// old edge. A rollback past the window brings back the entries the dropped tokens had pushed out
// (SPEC 4's window over the sequence that remains), so a saved state must carry them too, not only
// the window: a restore that keeps the window alone is right until the first such rollback. The
// restored row, rolled back and fed tokens of its own, must equal its sequence alone.
#include <ATen/ATen.h>

#include "rows.h"

namespace tinygpt::checks {

namespace {

// A 5-token prompt run 24 past the window, saved; restored (after a reset: nothing else of the row
// left) and rolled back by 16, then 16 steps of its own. Scaled down for a smaller window.
struct Lengths {
  int64_t prompt, past, back, after;
  explicit Lengths(int64_t context)
      : prompt(5), past(std::min<int64_t>(24, kRollbackEntries / 2)), back(std::min<int64_t>(16, kRollbackEntries / 4)),
        after(std::min<int64_t>(16, context / 2)) {}
};

}  // namespace

void rollback_after_restore_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  const Lengths n(ctx);
  c.target.reset();
  at::Tensor logits;
  Seen s;
  s.seq = serving_prompt(n.prompt, 0, V);
  const int64_t row = c.target.serving().add_rows({s.seq}, logits)[0];
  s.add(n.prompt - 1, logits.to(at::kCPU)[0]);
  decode_seen(c.target, row, ctx + n.past - n.prompt, s);  // the next position: context + past
  double worst = 0;
  if (!judge_seen(c, r, s, "the row before it was saved", &worst)) return;
  const std::string state = c.target.serving().save_row(row);
  c.target.reset();
  const int64_t restored = c.target.serving().restore_row(state);
  // The rollback: the newest `back` tokens fed go, and the row goes on with tokens of its own.
  c.target.serving().truncate_row(restored, n.back);
  Seen after;
  const int64_t kept = static_cast<int64_t>(s.seq.size()) - n.back;  // every id of s.seq was fed
  after.seq.assign(s.seq.begin(), s.seq.begin() + kept);
  const std::vector<int64_t> own = serving_prompt(n.after, 3, V);
  for (int64_t id : own) {
    after.seq.push_back(id);
    after.add(static_cast<int64_t>(after.seq.size()) - 1, c.target.serving().step_rows({restored}, {id}).to(at::kCPU)[0]);
  }
  if (!judge_seen(c, r, after, "restored, rolled back by " + std::to_string(n.back) + " from position " + std::to_string(ctx + n.past) +
                                   " and fed " + std::to_string(n.after) + " tokens of its own",
                  &worst))
    return;
  r.figure = worst;
  set_result(r, true, "saved at position " + std::to_string(ctx + n.past) + " (" + std::to_string(n.past) + " past the window), restored after a " +
                          "reset, rolled back by " + std::to_string(n.back) + " across the window's old edge and fed " + std::to_string(n.after) +
                          " tokens: equals its sequence alone (worst |diff| " + sci(worst) + ")");
}

// --- The row of the check table (check_table.cpp lists it) ---

CheckDef rollback_after_restore_def() {
  return {check::kRollbackAfterRestore,
          "a row saved past the window, restored and rolled back across the window's old edge equals its sequence alone (a "
          "state carries the entries a rollback brings back, not the window alone)",
          rollback_after_restore_check, Tag::Serving | Tag::PastWindow | Tag::OnlyPastWindow | Tag::Long, Judge::Reference,
          {Op::Save, Op::Truncate}, Cost::Run, "a saved state that keeps the window only: right until the restored row rolls back"};
}

}  // namespace tinygpt::checks
