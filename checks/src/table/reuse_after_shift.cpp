// reuse-after-shift: a new prompt made of a context-shifted row's own tokens, admitted after that row
// left. The shifted row's later entries were computed while the tokens the shift dropped were still
// visible: they are not the entries a cold run of the new prompt computes, so a prompt cache that
// offers them as its prefix serves the wrong entries (llama-server's slots keep a shifted conversation
// as their cache and match later prompts against it). Only the entries before the shift's `keep` may
// be reused. The new row, and a miss admitted beside it, must equal their sequences alone.
#include <ATen/ATen.h>

#include "rows.h"

namespace tinygpt::checks {

namespace {

// The fixture's window (256): a 60-token row, 4 kept, 20 dropped; a new prompt of what is left and 2
// more tokens, decoded 8 steps. Scaled down for a smaller window.
struct Lengths {
  int64_t prompt, keep, discard, more, steps;
  explicit Lengths(int64_t context)
      : prompt(std::min<int64_t>(60, context - 4)), keep(std::min<int64_t>(4, prompt / 8)),
        discard(std::min<int64_t>(20, (prompt - keep) / 2)), more(2), steps(std::min<int64_t>(8, context / 16)) {}
};

}  // namespace

void reuse_after_shift_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size;
  const Lengths n(c.model->config().context);
  c.target.reset();
  at::Tensor logits;
  // The row that is shifted: its prompt, a shift, and it leaves.
  Seen first;
  first.seq = serving_prompt(n.prompt, 0, V);
  const int64_t row = c.target.serving().add_rows({first.seq}, logits)[0];
  first.add(n.prompt - 1, logits.to(at::kCPU)[0]);
  double worst = 0;
  if (!judge_seen(c, r, first, "the row before its shift", &worst)) return;
  c.target.serving().shift_row(row, n.keep, n.discard);
  c.target.serving().release_row(row);
  // The new prompt: the shifted row's tokens as they now stand (the kept ones, those after the gap),
  // then tokens of its own; beside it, a miss sharing nothing.
  std::vector<int64_t> prompt(first.seq.begin(), first.seq.begin() + n.keep);
  prompt.insert(prompt.end(), first.seq.begin() + n.keep + n.discard, first.seq.end());
  const std::vector<int64_t> tail = serving_prompt(n.more, 7, V);
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  const std::vector<int64_t> miss = serving_prompt(9, 8, V);
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
  if (!judge_seen(c, r, hit, "a " + std::to_string(prompt.size()) + "-token prompt of the shifted row's tokens" + said, &worst) ||
      !judge_seen(c, r, cold, "the miss admitted beside it", &worst))
    return;
  r.figure = worst;
  if (!reused.empty()) r.stats["reused"] = static_cast<double>(reused[0]);
  set_result(r, true, "a " + std::to_string(n.prompt) + "-token row shifted (keep " + std::to_string(n.keep) + ", drop " +
                          std::to_string(n.discard) + ") and released; a prompt of its " + std::to_string(prompt.size() - n.more) +
                          " remaining tokens and " + std::to_string(n.more) + " more, beside a miss: both equal their sequences alone " +
                          "(worst |diff| " + sci(worst) + ")" +
                          (reused.empty() ? "; the target does not say what it reused"
                                          : "; the target reused " + std::to_string(reused[0]) + " (at most the " + std::to_string(n.keep) +
                                                " kept before the shift are a cold run's)"));
}

// --- The row of the check table (check_table.cpp lists it) ---

CheckDef reuse_after_shift_def() {
  return {check::kReuseAfterShift,
          "a prompt of a context-shifted row's own tokens, admitted after the row left: it and a miss beside it equal their "
          "sequences alone (the entries after the shift's kept ones were computed beside the dropped tokens: never a cold "
          "run's prefix)",
          reuse_after_shift_check, static_cast<Tags>(Tag::Serving), Judge::Reference, {Op::Ragged, Op::Join, Op::Shift}, Cost::Run,
          "a prompt cache that serves a shifted row's entries as a later prompt's prefix", 2};
}

}  // namespace tinygpt::checks
