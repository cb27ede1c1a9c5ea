// chunked-prefill: a prompt prefilled in chunks (a request per chunk, each appended to the row with
// extend) equals the one-pass prefill and the reference at every chunk's end and in the steps after;
// and a row extended by several tokens after it generated equals the reference (the bugs engines
// have had there: a chunk's positions restarting at the chunk, the last generated token missing from
// the cache, logits wrong only when the prompt is longer than a micro-batch). Inside the window: a
// chunk that crossed the window's edge would see another window for each of its queries.
#include <ATen/ATen.h>

#include <numeric>

#include "rows.h"

namespace tinygpt::checks {

namespace {

// The run's lengths, scaled to the window (the fixture's 256: a 97-token prompt, 16 steps after it;
// continue after generate: a 20-token prompt, 8 steps, 12 tokens appended, 8 more steps).
struct Lengths {
  int64_t prompt, decode_after, first_prompt, generated, appended;
  explicit Lengths(int64_t context)
      : prompt(std::min<int64_t>(97, context / 2 - 1)), decode_after(std::min<int64_t>(16, context / 8)),
        first_prompt(std::min<int64_t>(20, context / 4)), generated(std::min<int64_t>(8, context / 8)),
        appended(std::min<int64_t>(12, context / 4)) {}
};

// The sizes of the equal chunks a prompt is prefilled in, one prefill each.
const std::vector<int64_t> kChunkSizes = {1, 2, 7, 16, 64};

// The chunk sizes of each prefill of an L-token prompt: every size in turn (the last chunk takes
// what is left), and one split at odd places (37 + 23 + 37 of 97).
std::vector<std::vector<int64_t>> chunkings(int64_t L) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t size : kChunkSizes) {
    std::vector<int64_t> c;
    for (int64_t done = 0; done < L; done += size) c.push_back(std::min(size, L - done));
    out.push_back(c);
  }
  const int64_t a = L / 3 + 5, b = L / 4 - 1;
  out.push_back({a, b, L - a - b});
  return out;
}

// "of 16" for equal chunks (the last takes the rest), "37+23+37" for a split.
std::string label(const std::vector<int64_t>& sizes) {
  bool equal = true;
  for (size_t k = 0; k + 1 < sizes.size(); ++k) equal = equal && sizes[k] == sizes[0];
  if (equal) return "of " + std::to_string(sizes[0]);
  std::string s;
  for (int64_t n : sizes) s += (s.empty() ? "" : "+") + std::to_string(n);
  return s;
}

}  // namespace

void chunked_prefill_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size;
  const Lengths n(c.model->config().context);
  const std::vector<int64_t> prompt = serving_prompt(n.prompt, 0, V);
  c.target.reset();
  at::Tensor logits;
  const int64_t whole = c.target.serving().add_rows({prompt}, logits)[0];
  const at::Tensor one_pass = logits.to(at::kCPU)[0];  // (V)
  c.target.serving().release_row(whole);
  double worst_vs_one_pass = 0;
  for (const auto& sizes : chunkings(n.prompt)) {
    const std::string what = "chunks " + label(sizes);
    c.target.reset();
    Seen s;
    s.seq.assign(prompt.begin(), prompt.begin() + sizes[0]);
    const int64_t row = c.target.serving().add_rows({s.seq}, logits)[0];
    s.add(sizes[0] - 1, logits.to(at::kCPU)[0]);
    for (size_t k = 1; k < sizes.size(); ++k) {
      const int64_t from = static_cast<int64_t>(s.seq.size());
      const std::vector<int64_t> chunk(prompt.begin() + from, prompt.begin() + from + sizes[k]);
      s.seq.insert(s.seq.end(), chunk.begin(), chunk.end());
      s.add(static_cast<int64_t>(s.seq.size()) - 1, c.target.serving().extend_row(row, chunk));
    }
    // Each chunk's last logits against the reference first: where a chunking parts, and how the
    // error goes on over the later chunks (what a diagnosis tells two chunking bugs apart by).
    if (!judge_seen(c, r, s, what + ", at each chunk's end")) return;
    // The prompt's last logits against the one-pass prefill's, by the one judge (judge.h).
    const StepDiffs vs = compare_steps(s.logits.back().view({1, 1, -1}), one_pass.view({1, 1, -1}), n.prompt - 1, c.tol().logits);
    const double d = vs.worst;
    worst_vs_one_pass = std::max(worst_vs_one_pass, d);
    if (const Verdict v = judge(vs, c.tol()); !v.ok) {
      // Where it parts, for a diagnosis: the prompt's last position, by this |diff|.
      r.stats["first_over"] = static_cast<double>(n.prompt - 1);
      r.stats["first_over_diff"] = r.stats["max_abs_diff"] = d;
      return set_result(r, false, what + ": the prompt's last logits against the one-pass prefill's: " +
                                      (c.tol().by_distribution() ? v.why : "|diff| " + sci(d) + " > " + sci(c.tol().logits)));
    }
    decode_seen(c.target, row, n.decode_after, s);
    if (!judge_seen(c, r, s, what)) return;
  }
  // Continue after generate: tokens appended in one request to a row that has been decoding.
  c.target.reset();
  Seen s;
  s.seq = serving_prompt(n.first_prompt, 1, V);
  const int64_t row = c.target.serving().add_rows({s.seq}, logits)[0];
  s.add(n.first_prompt - 1, logits.to(at::kCPU)[0]);
  decode_seen(c.target, row, n.generated, s);
  s.seq.push_back(top1(s.logits.back()));  // the last generated token, appended with the new ones
  const std::vector<int64_t> more = serving_prompt(n.appended, 2, V);
  std::vector<int64_t> appended = {s.seq.back()};
  appended.insert(appended.end(), more.begin(), more.end());
  s.seq.insert(s.seq.end(), more.begin(), more.end());
  s.add(static_cast<int64_t>(s.seq.size()) - 1, c.target.serving().extend_row(row, appended));
  decode_seen(c.target, row, n.generated, s);
  if (!judge_seen(c, r, s, "extended by " + std::to_string(appended.size()) + " tokens after " + std::to_string(n.generated) + " steps"))
    return;
  r.figure = std::max(worst_vs_one_pass, r.figure.value_or(0));
  const auto odd = chunkings(n.prompt).back();
  set_result(r, true, "a " + std::to_string(n.prompt) + "-token prompt in chunks of 1, 2, 7, 16, 64 and " + label(odd) +
                          ": its last logits equal the one-pass prefill (worst |diff| " + sci(worst_vs_one_pass) +
                          ") and every chunk's end and " + std::to_string(n.decode_after) + " steps after equal the reference; a row extended by " +
                          std::to_string(appended.size()) + " tokens after generating equals it too (" + r.detail + ")");
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

CheckDef chunked_prefill_def() {
  return {check::kChunkedPrefill,
  "a prompt prefilled in chunks (" + list_text(kChunkSizes) + " and an odd split) equals the one-pass prefill and the reference at "
  "every chunk's end and after; a row extended by several tokens after generating equals the reference",
  chunked_prefill_check, static_cast<Tags>(Tag::Serving), Judge::Reference, {Op::Extend}, Cost::Run,
  "a chunk's positions restarting at the chunk, the last generated token missing from the cache"};
}

}  // namespace tinygpt::checks
