// reuse-past-window: a new prompt sharing its prefix with a row that ran past the window before it
// left. The row's first entries are gone from a cache that keeps the window (a ring's are overwritten;
// ours keep kRollbackEntries more, and the row runs past those too): a prompt cache that offers that
// row as the prefix serves later positions' entries for the first ones. The new row, and a miss
// admitted beside it, must equal their sequences alone, however much the target reused.
#include <ATen/ATen.h>

#include "rows.h"

namespace tinygpt::checks {

namespace {

// The fixture's window (256): a 40-token prompt run past the window and its history by 16; the new
// prompt is that prompt and 3 more tokens, decoded 8 steps. Scaled down for a smaller window.
struct Lengths {
  int64_t prompt, more, steps;
  explicit Lengths(int64_t context)
      : prompt(std::min<int64_t>(40, context / 4)), more(3), steps(std::min<int64_t>(8, context / 16)) {}
};

}  // namespace

void reuse_past_window_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  const Lengths n(ctx);
  c.target.reset();
  at::Tensor logits;
  // The row that runs past the window: greedy steps until its next position is far past it.
  Seen first;
  first.seq = serving_prompt(n.prompt, 0, V);
  const int64_t row = c.target.serving().add_rows({first.seq}, logits)[0];
  first.add(n.prompt - 1, logits.to(at::kCPU)[0]);
  // Beyond what any cache of ours keeps of the start (the window and kRollbackEntries), by less than the
  // prompt: what a cache still holds of the row is then later entries of it, in place of the first.
  const int64_t past = ctx + kRollbackEntries + std::min(kPastTheWindow, n.prompt / 2);
  decode_seen(c.target, row, past - n.prompt, first);
  c.target.serving().release_row(row);
  double worst = 0;
  if (!judge_seen(c, r, first, "the row that ran past the window", &worst)) return;
  // Its prompt again, with tokens of its own after it, beside a miss sharing nothing.
  std::vector<int64_t> prompt(first.seq.begin(), first.seq.begin() + n.prompt);
  const std::vector<int64_t> tail = serving_prompt(n.more, 5, V);
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  const std::vector<int64_t> miss = serving_prompt(11, 6, V);
  const std::vector<int64_t> rows = c.target.serving().add_rows({prompt, miss}, logits);
  const std::vector<int64_t> reused = c.target.serving().reused();
  Seen hit, cold;
  hit.seq = prompt, cold.seq = miss;
  const at::Tensor l = logits.to(at::kCPU);  // (2, V)
  hit.add(static_cast<int64_t>(prompt.size()) - 1, l[0]);
  cold.add(static_cast<int64_t>(miss.size()) - 1, l[1]);
  decode_seen(c.target, rows[0], n.steps, hit);
  decode_seen(c.target, rows[1], n.steps, cold);
  const std::string said = reused.empty() ? "" : " (the target reused " + std::to_string(reused[0]) + ")";
  if (!judge_seen(c, r, hit, "its prompt and " + std::to_string(n.more) + " more tokens" + said, &worst) ||
      !judge_seen(c, r, cold, "the miss admitted beside it", &worst))
    return;
  r.figure = worst;
  if (!reused.empty()) r.stats["reused"] = static_cast<double>(reused[0]);
  set_result(r, true, "a " + std::to_string(n.prompt) + "-token row run to position " + std::to_string(past) +
                          " (past the window and the entries a rollback keeps) and released; its prompt and " + std::to_string(n.more) +
                          " more, beside a miss: both equal their sequences alone (worst |diff| " + sci(worst) + ")" +
                          (reused.empty() ? "; the target does not say what it reused" : "; the target reused " + std::to_string(reused[0])));
}

// --- The row of the check table (check_table.cpp lists it) ---

CheckDef reuse_past_window_def() {
  return {check::kReusePastWindow,
          "a prompt sharing its prefix with a row that ran past the window before it left: it and a miss beside it equal their "
          "sequences alone (the row's first entries are gone from the cache: never a prefix to serve)",
          reuse_past_window_check, Tag::Serving | Tag::PastWindow | Tag::OnlyPastWindow | Tag::Long, Judge::Reference,
          {Op::Ragged, Op::Join}, Cost::Run,
          "a prompt cache that serves a prefix from a row whose first entries the window pushed out (a ring overwritten)", 2};
}

}  // namespace tinygpt::checks
