// served: requests an engine schedules itself (op "generate": a continuous-batching manager, a
// server's slots), in scenarios that make the scheduler work - mixed prompt lengths, staggered
// arrivals, prompts sharing a prefix with a request that finished (a prompt cache), a long prompt
// arriving while others decode (chunked prefill under a token budget), several sequences of one
// prompt (forks). The suite cannot see the engine's batches, only each sequence it returns; so each is
// judged against the reference over that sequence alone: every token the greedy choice (a near-tie
// within the bound may go either way), and what it was chosen from within the bound - the whole
// logits, or the top-N log-probabilities where an engine gives no more (log-softmax moves at most
// twice the largest logit difference, so those are held to twice the logit bound).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "reference_entries.h"
#include "rows.h"

namespace tinygpt::checks {

namespace {

struct Scenario {
  std::string name;
  std::vector<ServedRequest> requests;
};

// The scenarios, scaled to the window (the fixture's 256: a 96-token shared prefix, a 200-token prompt);
// with `shifting` (an engine that shifts its context past the window: op generate-shift) a sixth.
ServedRequest request(int64_t id, std::vector<int64_t> prompt, int64_t n, int64_t after = 0) {
  ServedRequest q;
  q.id = id, q.prompt = std::move(prompt), q.n = n, q.after = after;
  return q;
}

std::vector<Scenario> scenarios(int64_t V, int64_t ctx, bool shifting) {
  const int64_t n = std::max<int64_t>(4, std::min<int64_t>(24, ctx / 10));
  auto prompt = [&](int64_t len, int64_t b) { return serving_prompt(std::max<int64_t>(1, std::min(len, ctx - n)), b, V); };
  std::vector<Scenario> out;
  {  // every length at once, finishing in another order than they came: rows of very different lengths
    Scenario s{"mixed lengths", {}};
    const int64_t lens[] = {3, 17, 40, 64, 90, 150}, steps[] = {n, n / 3, n, n / 2, n / 4, n};
    for (int64_t i = 0; i < 6; ++i) s.requests.push_back(request(i, prompt(lens[i] * ctx / 256, i), std::max<int64_t>(1, steps[i])));
    out.push_back(std::move(s));
  }
  {  // arrivals while others decode: rows joining a running batch
    Scenario s{"staggered arrivals", {}};
    const int64_t lens[] = {9, 33, 5, 70}, after[] = {0, 3, 7, 15};
    for (int64_t i = 0; i < 4; ++i) s.requests.push_back(request(10 + i, prompt(lens[i] * ctx / 256, 10 + i), n, after[i]));
    out.push_back(std::move(s));
  }
  {  // a prompt cache's hits: prompts sharing a prefix with a request that finished, the whole prompt too
    Scenario s{"prefix reuse after a finished request", {}};
    const std::vector<int64_t> prefix = prompt(96 * ctx / 256, 20);
    auto with_tail = [&](int64_t len, int64_t b) {
      std::vector<int64_t> p = prefix;
      const std::vector<int64_t> t = serving_prompt(len, b, V);
      p.insert(p.end(), t.begin(), t.end());
      return p;
    };
    s.requests.push_back(request(20, with_tail(8, 21), n / 2));
    const int64_t tails[] = {5, 11, 17, 23};
    for (int64_t i = 0; i < 4; ++i) {
      s.requests.push_back(request(21 + i, with_tail(tails[i], 22 + i), n / 2));
      s.requests.back().after_finished = {20};
    }
    s.requests.push_back(request(25, with_tail(8, 21), n / 2));  // the finished request's own prompt: all of it cached
    s.requests.back().after_finished = {20};
    out.push_back(std::move(s));
  }
  {  // a long prompt arriving while short ones decode: a token budget splits it over several forwards
    Scenario s{"a long prompt beside decoding rows", {}};
    s.requests.push_back(request(30, prompt(4, 30), n));
    s.requests.push_back(request(31, prompt(6, 31), n));
    s.requests.push_back(request(32, prompt(200 * ctx / 256, 32), n / 2, 2));
    out.push_back(std::move(s));
  }
  {  // several sequences of one prompt (forks: copy-on-write blocks) beside another request
    Scenario s{"forks of one prompt", {}};
    s.requests.push_back(request(40, prompt(20, 40), n));
    s.requests.back().copies = 3;
    s.requests.push_back(request(41, prompt(12, 41), n));
    out.push_back(std::move(s));
  }
  if (shifting) {  // a request that outgrows the window, shifted as llama-server does (keeping 4), beside a short one
    Scenario s{"past the window by a context shift", {}};
    ServedRequest past = request(50, serving_prompt(ctx - 6, 50, V), std::max<int64_t>(8, ctx / 6));
    past.keep = 4;
    s.requests.push_back(past);
    s.requests.push_back(request(51, prompt(9, 51), n));
    out.push_back(std::move(s));
  }
  return out;
}

// What each id of a sequence that went past the window was chosen from, (1, n, V): the uncached model's
// own entries of the prompt, shifted as the engine says it shifted them (ReferenceEntries: keys
// re-rotated in double precision), each id fed after the shifts before it. With no shift, SPEC 4's
// rolling window (the banded reference).
at::Tensor past_window_reference(GPT& model, const std::vector<int64_t>& prompt, const ServedResult& res, c10::Device dev) {
  const int64_t T0 = static_cast<int64_t>(prompt.size()), n = static_cast<int64_t>(res.ids.size());
  if (res.shifts.empty()) {
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), res.ids.begin(), res.ids.end());
    return reference_for(model, at::tensor(seq, at::kLong).unsqueeze(0).to(dev), T0, n).band.to(at::kCPU);
  }
  ReferenceEntries entries(model->config());
  at::Tensor next = model->step(at::tensor(prompt, at::kLong).unsqueeze(0).to(dev), entries, 0);  // (1, V)
  std::vector<at::Tensor> out;
  int64_t pos = T0;
  size_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(next[0].to(at::kCPU));
    if (i + 1 == n) break;
    for (; k < res.shifts.size() && res.shifts[k].before == i; ++k) {  // before feeding ids[i]
      entries.shift(res.shifts[k].keep, res.shifts[k].discard);
      pos -= res.shifts[k].discard;
    }
    next = model->step(at::tensor(std::vector<int64_t>{res.ids[static_cast<size_t>(i)]}, at::kLong).view({1, 1}).to(dev), entries, pos++);
  }
  return at::stack(out, 0).unsqueeze(0);  // (1, n, V)
}

std::string request_name(const Scenario& s, const ServedRequest& q, int64_t copy) {
  std::string name = "'" + s.name + "', request " + std::to_string(q.id) + " (" + std::to_string(q.prompt.size()) + "-token prompt";
  if (q.after) name += ", arriving after " + std::to_string(q.after) + " tokens";
  if (!q.after_finished.empty()) name += ", after request " + std::to_string(q.after_finished[0]) + " finished";
  if (q.copies > 1) name += ", copy " + std::to_string(copy) + " of " + std::to_string(q.copies);
  return name + ")";
}

struct Tally {
  int64_t sequences = 0, tokens = 0, near_ties = 0, reused = 0, prompt_tokens = 0, said_reused = 0, shifts = 0;
  double worst = 0;
  double worst_kl = 0;  // top-N answers under a KL budget: the largest mean coarsened KL of a sequence
  std::string worst_where;
  bool top_only = false;
};

// One sequence against the reference over it alone. False (and `r` says where) when over the bound.
bool judge_result(CheckContext& c, CheckResult& r, const ServedRequest& q, const ServedResult& res, const std::string& name,
                  Tally& tally) {
  const int64_t T0 = static_cast<int64_t>(q.prompt.size()), n = q.n;
  std::vector<int64_t> seq = q.prompt;
  seq.insert(seq.end(), res.ids.begin(), res.ids.end());
  seq.pop_back();  // the last id predicts nothing judged here
  const at::Tensor ids = at::tensor(seq, at::kLong).unsqueeze(0).to(c.opts.prompt.device());  // (1, T0 + n - 1)
  const int64_t ctx = c.model->config().context;
  at::NoGradGuard no_grad;
  // What ids[i] was chosen from, (1, n, V): inside the window the full causal forward over the sequence
  // (position p predicts token p + 1: SPEC 3's uncached reference); past it, the shifted entries.
  const at::Tensor ref = T0 + n - 1 <= ctx && res.shifts.empty() ? c.model->forward(ids).narrow(1, T0 - 1, n).to(at::kCPU)
                                                                  : past_window_reference(c.model, q.prompt, res, ids.device());
  tally.shifts += static_cast<int64_t>(res.shifts.size());
  const double tol = c.tol().logits, pair = 2 * tol;
  // Tokens: the greedy choice of the sequence alone; a near-tie (reference margin within twice the
  // bound: each side may be off by the bound) may go either way, and the reference follows the engine.
  // Judged by the distribution (--max-kl / --min-top1), a chosen id is the judge's to weigh (top-1
  // agreement), not a failure of its own.
  for (int64_t i = 0; i < n && !c.tol().by_distribution(); ++i) {
    const at::Tensor row = ref[0][i];
    const int64_t want = row.argmax().item<int64_t>(), got = res.ids[static_cast<size_t>(i)];
    if (got == want) continue;
    const double margin = (row[want] - row[got]).item<double>();
    if (margin > pair) {
      r.stats["first_over"] = static_cast<double>(T0 - 1 + i);
      set_result(r, false, name + ": chose id " + std::to_string(got) + " at position " + std::to_string(T0 + i) +
                               " where the sequence alone gives " + std::to_string(want) + " (its logit " + sci(margin) +
                               " above the chosen one's, more than twice the bound " + sci(tol) + ")");
      return false;
    }
    ++tally.near_ties;
  }
  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = T0 - 1 + i;
  double worst = 0;
  if (res.logits.defined()) {
    const StepDiffs d = judge_positions(r, c.tol(), res.logits.unsqueeze(0), ref, positions);
    if (!r.ok()) {
      r.detail = name + ": " + r.detail;
      return false;
    }
    worst = d.worst;
  } else if (c.tol().max_kl) {
    // Top-N log-probabilities under a KL budget: both distributions coarsened to the engine's listed ids
    // and one outcome for the rest. Coarsening never raises a KL (the data-processing inequality), so a
    // mean over the budget here is over it on the whole vocabulary too.
    tally.top_only = true;
    const at::Tensor lp = ref[0].to(at::kDouble).log_softmax(-1);  // (n, V)
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      double kl = 0, p_rest = 1, q_rest = 1;
      for (const auto& [id, got] : res.top[static_cast<size_t>(i)]) {
        const double want = lp[i][id].item<double>(), p = std::exp(want);
        kl += p * (want - got);
        p_rest -= p;
        q_rest -= std::exp(got);
        worst = std::max(worst, std::abs(got - want));
      }
      p_rest = std::max(p_rest, 0.0), q_rest = std::max(q_rest, 1e-300);
      if (p_rest > 0) kl += p_rest * std::log(p_rest / q_rest);
      sum += kl;
    }
    const double mean = n > 0 ? sum / static_cast<double>(n) : 0.0;
    tally.worst_kl = std::max(tally.worst_kl, mean);
    if (mean > *c.tol().max_kl) {
      r.stats["first_over"] = static_cast<double>(T0 - 1);
      set_result(r, false, name + ": mean KL per step " + sci(mean) + " over its top-N log-probabilities and the rest > " +
                               sci(*c.tol().max_kl));
      return false;
    }
  } else {  // top-N log-probabilities: held to twice the logit bound, and they must be our top N
    tally.top_only = true;
    const at::Tensor lp = ref[0].to(at::kDouble).log_softmax(-1);  // (n, V)
    for (int64_t i = 0; i < n; ++i) {
      const auto& entries = res.top[static_cast<size_t>(i)];
      const at::Tensor sorted = std::get<0>(lp[i].sort(-1, /*descending=*/true));
      const double nth = sorted[std::min<int64_t>(static_cast<int64_t>(entries.size()), lp.size(1)) - 1].item<double>();
      for (const auto& [id, got] : entries) {
        const double want = lp[i][id].item<double>(), diff = std::abs(got - want);
        if (diff > worst) worst = diff;
        const bool outside = want < nth - pair;
        if (diff > pair || outside) {
          r.stats["first_over"] = static_cast<double>(T0 - 1 + i);
          r.stats["first_over_diff"] = diff;
          set_result(r, false, name + ": position " + std::to_string(T0 - 1 + i) + ", id " + std::to_string(id) + ": " +
                                   (outside ? "listed among the engine's top " + std::to_string(entries.size()) +
                                                  " but ranked below the sequence's own (log p " + sci(want) + " < " + sci(nth) + ")"
                                            : "log-probability " + sci(got) + " against the sequence alone's " + sci(want) + " (|diff| " +
                                                  sci(diff) + " > " + sci(pair) + ", twice the logit bound)"));
          return false;
        }
      }
    }
  }
  if (worst >= tally.worst) tally.worst = worst, tally.worst_where = name;
  tally.sequences += 1;
  tally.tokens += n;
  tally.prompt_tokens += T0;
  if (res.reused) tally.reused += *res.reused, tally.said_reused += 1;
  return true;
}

}  // namespace

void served_check(CheckContext& c, CheckResult& r) {
  const int64_t V = c.model->config().vocab_size, ctx = c.model->config().context;
  // The sixth scenario goes past the window: not for an engine without a shift, nor in a run kept
  // inside the window (--no-past-window, or declared no-window).
  const std::string no_shift =
      c.opts.past_window ? c.target.offers().why_not(Op::GenerateShift) : "the run stays inside the window (" + c.opts.inside_window_why + ")";
  const std::vector<Scenario> all = scenarios(V, ctx, no_shift.empty());
  Tally tally;
  int64_t requests = 0;
  for (const Scenario& s : all) {
    c.target.reset();
    const std::vector<ServedResult> results = c.target.serve(s.requests);
    std::map<int64_t, const ServedRequest*> by_id;
    for (const ServedRequest& q : s.requests) by_id[q.id] = &q;
    requests += static_cast<int64_t>(s.requests.size());
    for (const ServedResult& res : results) {
      const ServedRequest& q = *by_id.at(res.id);
      if (!judge_result(c, r, q, res, request_name(s, q, res.copy), tally)) return;
    }
  }
  r.stats["requests"] = static_cast<double>(requests);
  r.stats["sequences"] = static_cast<double>(tally.sequences);
  r.stats["tokens"] = static_cast<double>(tally.tokens);
  r.stats["near_ties"] = static_cast<double>(tally.near_ties);
  r.stats["worst"] = tally.worst;
  if (tally.said_reused) r.stats["reused"] = static_cast<double>(tally.reused);
  r.stats["shifts"] = static_cast<double>(tally.shifts);
  const std::string past = no_shift.empty() ? "; past the window: " + std::to_string(tally.shifts) + " context shift(s), judged against our model's entries shifted alike"
                                            : "; no request past the window: " + no_shift;
  const std::string reuse = tally.said_reused ? "; " + std::to_string(tally.reused) + " prompt tokens served from the engine's cache"
                                              : "; the engine did not say what it reused";
  set_result(r, true,
             std::to_string(requests) + " requests (" + std::to_string(tally.sequences) + " sequences, " + std::to_string(tally.tokens) +
                 " tokens) in " + std::to_string(all.size()) +
                 " scenarios: " +
                 (c.tol().by_distribution() ? "every sequence within " + (c.tol().max_kl ? "mean KL " + sci(*c.tol().max_kl) : r.bound) + " of its own sequence alone"
                                            : "every token the greedy choice of its own sequence alone") +
                 (tally.near_ties ? " (" + std::to_string(tally.near_ties) + " near-ties went the other way)" : "") + "; worst " +
                 (tally.top_only ? "|diff| of logits or top log-probabilities " : "|diff| ") + sci(tally.worst) + " at " +
                 tally.worst_where +
                 (tally.top_only && c.tol().max_kl
                      ? " (top-N log-probabilities judged by their KL coarsened to the listed ids and the rest: largest mean " +
                            sci(tally.worst_kl) + ")"
                  : tally.top_only && c.tol().by_distribution()
                      ? " (top-N log-probabilities are no distribution: those answers judged by |diff| at twice the logit bound)"
                      : "") +
                 reuse + past);
}

// --- The rows of the check table this file runs (check_table.cpp lists them in order) ---

// Engines that schedule their own requests: our model has none (its rows are driven directly above).
CheckDef served_def() {
  return {check::kServed,
  "requests the engine schedules itself (mixed lengths, staggered arrivals, prefix reuse after a finished request, a "
  "long prompt beside decoding rows, forks): every sequence it returns is the greedy run of its own prompt alone, its "
  "logits (or top-N log-probabilities) within the bound",
  served_check, Tag::Serving | Tag::EngineOnly, Judge::Reference, {Op::Generate}, Cost::Runs,
  "a scheduler that mixes up requests, a batch's padding or positions leaking into a row, a stale or too-long cached "
  "prefix, a chunk of a split prompt at the wrong positions, forks sharing blocks they write"};
}

}  // namespace tinygpt::checks
