// thread-counts: the same greedy run at 1 thread, 2 and every core the process may use gives the same
// logits - bitwise where the target's arithmetic does not depend on how its work is split, and
// within the tolerance always. Users ask it of every engine: a reduction split across threads
// changes the order of a sum, and so its last bits; a cache that races between threads changes more.
// The figures are the largest |diff| from the 1-thread run at each count; with
// --require-thread-invariance any difference fails.
#include <ATen/ATen.h>

#include <algorithm>

#include "rows.h"
#include "tinygpt/device.h"

namespace tinygpt::checks {

namespace {

// The counts it runs at, then the cores available (each once, in that order).
const std::vector<int> kCounts = {1, 2};
std::vector<int> thread_counts(const EquivalenceOptions& o) {
  std::vector<int> counts = kCounts;
  counts.push_back(available_cores());
  if (!o.thread_counts.empty()) counts = o.thread_counts;
  std::vector<int> out;
  for (int t : counts)
    if (t >= 1 && std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  return out;
}

// Restores the target's thread count however the row ends.
struct ThreadsRestored {
  DecodeTarget& t;
  int before = -1;
  ~ThreadsRestored() {
    if (before > 0) try {
        t.set_threads(before);
      } catch (...) {  // the row's own error already says what went wrong
      }
  }
};

}  // namespace

void thread_counts_check(CheckContext& c, CheckResult& r) {
  constexpr int64_t kSteps = 40;
  const int64_t n = std::min<int64_t>(c.opts.tokens, kSteps);
  const at::Tensor prompt = c.opts.prompt.narrow(0, 0, 1);  // (1, T0)
  const std::vector<int> counts = thread_counts(c.opts);
  ThreadsRestored restore{c.target};
  at::Tensor first, first_seq;  // (1, n, V), (1, T0 + n): the run at counts[0]
  double worst = 0;
  std::string exact, inexact;
  for (int t : counts) {
    const int before = c.target.set_threads(t);
    if (restore.before < 0) restore.before = before;
    const Generation g = c.target.generate(prompt, n, greedy());
    const at::Tensor logits = g.logits.to(at::kCPU), seq = g.seq.to(at::kCPU);
    if (!first.defined()) {
      first = logits, first_seq = seq;
      continue;
    }
    // Compared up to where the greedy tokens part (a near-tie picked differently is a difference of
    // the run, measured at the step it happens, not of every step after it).
    int64_t upto = n;
    for (int64_t i = 0; i + 1 < n; ++i)
      if (seq[0][prompt.size(1) + i].item<int64_t>() != first_seq[0][prompt.size(1) + i].item<int64_t>()) {
        upto = i + 1;
        break;
      }
    const double d = (logits.narrow(1, 0, upto) - first.narrow(1, 0, upto)).abs().max().item<double>();
    r.stats["threads_" + std::to_string(t)] = d;
    worst = std::max(worst, d);
    std::string& list = d == 0 ? exact : inexact;
    list += (list.empty() ? "" : ",") + std::to_string(t);
    if (d > c.tol().logits)
      return set_result(r, false, std::to_string(t) + " threads: the run differs from 1 thread by " + sci(d) + " > " +
                                      sci(c.tol().logits));
  }
  std::string names;
  for (size_t i = 0; i < counts.size(); ++i)
    names += (i == 0 ? "" : i + 1 == counts.size() ? " and " : ", ") + std::to_string(counts[i]);
  r.figure = worst;
  r.bound = "max |diff| <= " + sci(c.tol().logits) + (c.opts.require_thread_invariance ? ", and bitwise identical" : "");
  if (counts.size() < 2)
    return set_result(r, true, "one thread count only (" + names + "): nothing to compare");
  set_result(r, !(c.opts.require_thread_invariance && worst > 0),
             "threads " + names + ", " + std::to_string(n) + " greedy steps each: bitwise identical to 1 thread at " +
                 (exact.empty() ? std::string("none") : exact) +
                 (inexact.empty() ? "" : "; largest |diff| " + sci(worst) + " (at " + inexact + ")"));
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

CheckDef thread_counts_def() {
  return {check::kThreadCounts,
  "the same greedy run at " + list_text(std::vector<int64_t>(kCounts.begin(), kCounts.end())) +
  " threads and at every core available: within the tolerance of the first count; bitwise invariance measured",
  thread_counts_check, 0, Judge::Invariance, {Op::Threads}, Cost::Runs,
  "a cache or kernel that races between threads; with --require-thread-invariance, any difference"};
}

}  // namespace tinygpt::checks
