// prefix-reuse: new prompts that share a prefix with a row that has left (a prompt cache's hit)
// against their sequences alone. A target may serve the shared prefix from what it kept of the
// released row (llama-server's prompt cache, vLLM's prefix caching; ours: RowBatch::add) and may say
// how many entries it reused (DecodeTarget::reused, protocol 3's "reused"); a target that reuses
// nothing passes and the row says so. The bugs engines have had here: the positions of a reused
// chunk, a reused prefix one entry too long when the whole prompt is cached (its last token must be
// computed again: its logits are the answer), the old row's entries past the shared prefix left
// visible. Each admission mixes a hit with a miss (a prompt sharing nothing) in one prefill.
#include <ATen/ATen.h>

#include "rows.h"

namespace tinygpt::checks {

namespace {

// The lengths, scaled to the window (the fixture's 256: a 48-token prompt, 8 greedy steps per row,
// 9-token tails after a shared prefix).
struct Lengths {
  int64_t prompt, steps, tail;
  explicit Lengths(int64_t context)
      : prompt(std::min<int64_t>(48, context / 4)), steps(std::min<int64_t>(8, context / 16)), tail(std::min<int64_t>(9, context / 16)) {}
};

}  // namespace

void prefix_reuse_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size;
  const Lengths n(c.model->config().context);
  c.target.reset();
  at::Tensor logits;
  // The first row: a prompt and its greedy tokens, then it leaves.
  Seen first;
  first.seq = serving_prompt(n.prompt, 0, V);
  const int64_t row0 = c.target.serving().add_rows({first.seq}, logits)[0];
  first.add(n.prompt - 1, logits.to(at::kCPU)[0]);
  decode_seen(c.target, row0, n.steps, first);
  c.target.serving().release_row(row0);
  double worst = 0;
  if (!judge_seen(c, r, first, "the first row", &worst)) return;
  // Prompts sharing k of its tokens, longest first, each admitted beside a miss: the whole prompt
  // and the first generated token, the whole prompt (every entry cached: the last must be computed
  // again), a multiple of 16 and one either side, one token.
  // A multiple of 16 inside the prompt with room either side (a short window's prompt: its middle).
  const int64_t m16 = n.prompt > 17 ? (n.prompt - 2) / 16 * 16 : std::max<int64_t>(2, n.prompt / 2);
  const std::vector<int64_t> shares = {n.prompt + 1, n.prompt, m16 + 1, m16, m16 - 1, 1};
  std::vector<int64_t> sequence = first.seq;  // what the newest left row holds
  std::string kept, reused_what;
  bool said = false, any = false;
  for (size_t i = 0; i < shares.size(); ++i) {
    const int64_t k = shares[i];
    std::vector<int64_t> prompt(sequence.begin(), sequence.begin() + k);
    if (k < n.prompt) {  // a tail of its own after the shared prefix, parting at its first token
      std::vector<int64_t> tail = serving_prompt(n.tail, 10 + static_cast<int64_t>(i), V);
      if (tail[0] == sequence[k]) tail[0] = (tail[0] + 1) % V;
      prompt.insert(prompt.end(), tail.begin(), tail.end());
    }
    const std::vector<int64_t> miss = serving_prompt(k % 7 + 5, 20 + static_cast<int64_t>(i), V);
    const std::vector<int64_t> rows = c.target.serving().add_rows({prompt, miss}, logits);
    const std::vector<int64_t> reused = c.target.serving().reused();
    const at::Tensor l = logits.to(at::kCPU);  // (2, V)
    Seen hit, cold;
    hit.seq = prompt, cold.seq = miss;
    hit.add(static_cast<int64_t>(prompt.size()) - 1, l[0]);
    cold.add(static_cast<int64_t>(miss.size()) - 1, l[1]);
    for (int64_t s = 0; s < n.steps; ++s) {  // both rows decode together
      hit.seq.push_back(top1(hit.logits.back()));
      cold.seq.push_back(top1(cold.logits.back()));
      const at::Tensor out = c.target.serving().step_rows(rows, {hit.seq.back(), cold.seq.back()}).to(at::kCPU);  // (2, V)
      hit.add(static_cast<int64_t>(hit.seq.size()) - 1, out[0]);
      cold.add(static_cast<int64_t>(cold.seq.size()) - 1, out[1]);
    }
    c.target.serving().release_row(rows[0]);
    c.target.serving().release_row(rows[1]);
    const std::string what = "a " + std::to_string(prompt.size()) + "-token prompt sharing " + std::to_string(k) + " tokens" +
                             (reused.empty() ? "" : " (the target reused " + std::to_string(reused[0]) + ")");
    if (!judge_seen(c, r, hit, what, &worst) || !judge_seen(c, r, cold, "the miss admitted beside it", &worst)) return;
    said = said || !reused.empty();
    if (!reused.empty()) {
      any = any || reused[0] > 0 || reused[1] > 0;
      kept += (kept.empty() ? "" : ", ") + std::to_string(reused[0]) + "/" + std::to_string(k);
      if (reused[1] != 0) reused_what += " (a miss reported " + std::to_string(reused[1]) + " reused)";
    }
    sequence = hit.seq;
  }
  // Beside a live row: a prompt sharing a prefix with a row still running (no live row is a source: its
  // entries are still being written). The running row must go on unharmed, the new one equal its cold run.
  c.target.reset();
  Seen running;
  running.seq = serving_prompt(n.prompt, 30, V);
  const int64_t a = c.target.serving().add_rows({running.seq}, logits)[0];
  running.add(n.prompt - 1, logits.to(at::kCPU)[0]);
  decode_seen(c.target, a, n.steps, running);
  std::vector<int64_t> beside(running.seq.begin(), running.seq.begin() + m16);
  std::vector<int64_t> own = serving_prompt(n.tail, 31, V);
  if (own[0] == running.seq[static_cast<size_t>(m16)]) own[0] = (own[0] + 1) % V;
  beside.insert(beside.end(), own.begin(), own.end());
  const int64_t b = c.target.serving().add_rows({beside}, logits)[0];
  const std::vector<int64_t> reused_beside = c.target.serving().reused();
  Seen joined;
  joined.seq = beside;
  joined.add(static_cast<int64_t>(beside.size()) - 1, logits.to(at::kCPU)[0]);
  decode_seen(c.target, a, n.steps, running);  // the running row first: it must go on unharmed
  decode_seen(c.target, b, n.steps, joined);
  if (!judge_seen(c, r, running, "the running row, after a prompt sharing its first " + std::to_string(m16) + " tokens joined", &worst) ||
      !judge_seen(c, r, joined, "a prompt sharing the first " + std::to_string(m16) + " tokens of a running row", &worst))
    return;
  if (!reused_beside.empty() && reused_beside[0] > 0) kept += ", beside a live row " + std::to_string(reused_beside[0]) + "/" + std::to_string(m16);
  r.figure = worst;
  r.stats["reused_any"] = any ? 1 : 0;
  std::string how = !said ? "the target does not say what it reused"
                    : any ? "reused/shared: " + kept + reused_what
                          : "the target reused nothing: every row computed cold";
  set_result(r, true, "prompts sharing " + std::to_string(n.prompt + 1) + ", " + std::to_string(n.prompt) + ", " + std::to_string(m16 + 1) +
                          ", " + std::to_string(m16) + ", " + std::to_string(m16 - 1) + " and 1 tokens with a row that left, each beside a miss, " +
                          "and " + std::to_string(m16) + " with a row still running: every row equals its sequence alone (worst |diff| " +
                          sci(worst) + "); " + how);
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

CheckDef prefix_reuse_def() {
  return {check::kPrefixReuse,
  "prompts sharing one to all of a left row's tokens (the whole prompt, and one more), each admitted beside a miss, and "
  "one sharing a running row's: every row, the running one too, equals its sequence alone, however much the target "
  "reused (the row says how much)",
  prefix_reuse_check, static_cast<Tags>(Tag::Serving), Judge::Reference, {Op::Ragged, Op::Join}, Cost::Run,
  "a reused prefix at the wrong positions or one entry too long (the last prompt token not computed again), the old "
  "row's entries left visible, a running row taken as the source and cut under it", 2};
}

}  // namespace tinygpt::checks
