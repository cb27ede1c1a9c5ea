// The speculative-decoding rows (docs/SPEC.md section 11, docs/speculative.md): a target's own
// draft-and-verify decoding (op "speculate") held to plain decoding and to the target's exact
// distribution.
//  - spec-greedy: temperature 0 is plain greedy, id for id, past the window, and every new id's logits
//    from a k + 1 token verify step are a one-token step's (our reference over the same sequence), for
//    a draft always right (the main run's own ids replayed: 100% accepted, asserted) at k = 4, 1 and 8,
//    prompt lookup and the trained draft;
//  - spec-seeded: sample-and-match at temperature > 0 is plain seeded decoding, draw for draw;
//  - spec-stops: a stop id inside an accepted block ends the output there, a token budget inside a
//    block gives exactly the budget, and plain steps after either go on as after plain decoding; the
//    penalty's history is the accepted ids;
//  - spec-cache: rounds of a draft never right (the main run's ids each moved by one: 0% accepted,
//    asserted) that each rejected every draft, and
//    plain steps on the same cache after them, are our reference's over the same sequence (what a rollback
//    left behind shows there);
//  - spec-distribution (deep): the exact rule's first two ids, by chi-square, against the target's exact
//    probabilities from our uncached model - marginal, joint, and after a rejection.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include <nlohmann/json.hpp>

#include "rows.h"
#include "tinygpt/generate.h"
#include "tinygpt/speculative.h"

namespace tinygpt::checks {

namespace {

// spec-greedy's runs: a draft at a k, over the whole main run or to the window's edge and kShortPast past
// it (where a width's numerics or a rollback's window first differ). The main run's own ids replayed
// cost no draft step: every one of them (always right: every verify step full) at every width, and with
// every p-th id moved by one (`wrong_every`: rounds accepted in part at known places, rollbacks of every
// length below k, with or without a trained draft) at kMainK and the widest. Prompt lookup and the
// always-right replay run the whole run (rollbacks as the ring wraps twice); the trained draft kMainK.
// The never-right draft is spec-cache's.
struct GreedyRun {
  const char* draft;
  int64_t k;
  bool whole;
  int64_t wrong_every = 0;  // replay: the ids at multiples of it moved by one (0: none)
  const char* instead_of = nullptr;  // run only where the target does not offer this draft
};
constexpr int64_t kMainK = 4;
// The drafts accepted in part first: a rollback's bugs show at their first rejection. An engine that
// cannot be handed drafts (no replay) has its own weights draft instead: always right, blocks whole.
constexpr GreedyRun kGreedyRuns[] = {{"model", kMainK, false},  {"replay", kMainK, false, 3}, {"ngram", kMainK, true},
                                     {"replay", kMainK, true},  {"self", kMainK, true, 0, "replay"},
                                     {"replay", 1, false},      {"replay", 8, false},         {"replay", 8, false, 5}};

// A run's name: its draft, and for a replay its wrong ids ("replay wrong every 3").
std::string run_label(const GreedyRun& g) {
  return std::string(g.draft) + (g.wrong_every ? " wrong every " + std::to_string(g.wrong_every) : "");
}
constexpr int64_t kShortPast = 32;
// spec-seeded's drafts: the plain seeded run's own ids replayed (every draw matches: blocks accepted
// whole, the bonus drawn) and prompt lookup (most rejected: the target's draw at the first mismatch).
const char* const kSeededDrafts[] = {"replay", "ngram"};
constexpr int64_t kSeededK = 2;
constexpr int64_t kStopK = 8;       // a stop inside a block of 8 accepted drafts
constexpr int64_t kBudget = 13;     // a budget inside the second block of 9
constexpr int64_t kThenPlain = 16;  // plain steps after a speculative run, on its cache
constexpr double kPenalty = 3.0;  // strong enough that a greedy run moves on from ids it has seen: drafts the history lacks
constexpr int64_t kPenaltyTokens = 48;
constexpr int64_t kCacheK = 4;
// spec-distribution: a bias D = sum((p' - p)^2 / p) of kBias found with kSigmas of power at a false
// alarm rate of kFalseAlarm per test.
constexpr double kBias = 0.01, kSigmas = 3.0, kFalseAlarm = 1e-6;
constexpr double kZFalseAlarm = 4.753424;  // the standard normal's upper 1e-6 quantile
constexpr int64_t kDistributionK = 1;      // one draft a round: accepted (then the bonus) or rejected (then the residual)
// The distribution's prompt: the main prompt and the first ids of the target's own greedy run from it, so
// the draft sees text it has learned (after the bare prompt ids a draft may put its mass where the target
// puts none, and every first draft is rejected).
constexpr int64_t kDistributionContext = 8;
// Runs of two ids that drafted nothing in this many: the row goes on with runs of three.
constexpr int64_t kProbeDraws = 20;

std::vector<int64_t> row0(const at::Tensor& t) {
  const at::Tensor r = t.to(at::kCPU).select(0, 0).contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

std::vector<int64_t> prompt_of(const CheckContext& c) { return row0(c.opts.prompt); }

SpeculativeSettings greedy_settings(int64_t k) {
  SpeculativeSettings s;
  s.k = k;
  s.sampling.temperature = 0;
  return s;
}

// `draft` "replay" replays the target's main greedy run (always right at temperature 0; a caller moves
// ids with replay_shift / replay_period); the others are the target's own drafts.
SpeculativeRequest request(CheckContext& c, const std::string& draft, int64_t n, const SpeculativeSettings& s, int64_t then = 0,
                           std::vector<int64_t> prompt = {}) {
  SpeculativeRequest q;
  q.prompt = prompt.empty() ? prompt_of(c) : std::move(prompt);
  q.n = n;
  q.draft = draft;
  q.draft_model = c.opts.draft;
  q.settings = s;
  q.then_plain = then;
  if (draft == "replay") q.replay = row0(c.main().seq);
  return q;
}

std::string pct(double x) {
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%", 100 * x);
  return b;
}

// Our banded reference (1, m, V) for the m ids of `seq` after its first T0: the main run's own when every
// id each step reads (all but the last) is the main run's - a run that stays on plain greedy, as most
// here do, costs no second forward - else one computed over `seq`.
at::Tensor band_for(CheckContext& c, const std::vector<int64_t>& seq, int64_t T0, int64_t m) {
  const std::vector<int64_t> main_seq = row0(c.main().seq);
  const bool on_main = T0 == c.opts.prompt.size(1) && m <= c.opts.tokens && std::equal(seq.begin(), seq.end() - 1, main_seq.begin());
  if (on_main) return c.main_reference().band.narrow(0, 0, 1).narrow(1, 0, m);
  return reference_for(c.model, at::tensor(seq, at::kLong).unsqueeze(0).to(c.opts.prompt.device()), T0, m).band;
}

// An engine's top-N log-probabilities for the ids of `seq` after its first T0 (top[i]: what id i was chosen
// from) against our reference's log-softmax over the same sequence: each within twice the logit bound
// (log-softmax moves at most twice the largest logit difference) and ranked among our top N, as `served`
// judges them. "" when within it, else where not; the row's statistics keep the largest |diff|.
std::string off_reference_top(CheckContext& c, CheckResult& r, const std::vector<int64_t>& seq, int64_t T0, const TopLogProbs& top) {
  const int64_t m = static_cast<int64_t>(top.size());
  const at::Tensor lp = band_for(c, seq, T0, m)[0].to(at::kCPU, at::kDouble).log_softmax(-1);  // (m, V)
  const double pair = 2 * c.tol().logits;
  r.bound = "top-N log-probabilities within " + sci(pair) + " (twice the logit bound) and among our top N";
  double worst = r.stats.count("max_abs_diff") ? r.stats["max_abs_diff"] : 0.0;
  std::string why;
  for (int64_t i = 0; i < m && why.empty(); ++i) {
    const auto& entries = top[static_cast<size_t>(i)];
    const at::Tensor sorted = std::get<0>(lp[i].sort(-1, /*descending=*/true));
    const double nth = sorted[std::min<int64_t>(static_cast<int64_t>(entries.size()), lp.size(1)) - 1].item<double>();
    for (const auto& [id, got] : entries) {
      const double want = lp[i][id].item<double>(), diff = std::abs(got - want);
      worst = std::max(worst, diff);
      if (diff <= pair && want >= nth - pair) continue;
      r.stats["first_over"] = static_cast<double>(T0 - 1 + i);
      why = "position " + std::to_string(T0 - 1 + i) + ", id " + std::to_string(id) + ": " +
            (diff > pair ? "log-probability " + sci(got) + " against ours over the same sequence " + sci(want) + " (|diff| " + sci(diff) +
                               " > " + sci(pair) + ")"
                         : "listed among the target's top " + std::to_string(entries.size()) + " but ranked below ours (log p " + sci(want) +
                               " < " + sci(nth) + ")") +
            " (" + std::to_string(m) + " new ids' top-N log-probabilities against our reference)";
      break;
    }
  }
  r.stats["max_abs_diff"] = worst;
  return why;
}

// A run's new logits (and those of the plain steps after it) against the banded reference over its own
// sequence (prompt + ids + then_ids), judged by the bound in force (judge.h: --max-kl / --min-top1 when
// set): "" when within it, else why not. The row's statistics keep the largest |diff| and the bound. A
// target that answers top-N log-probabilities is judged by them (off_reference_top); one that answers
// ids alone is not judged here (its ids are; the row says so: stats "ids_only").
std::string off_reference(CheckContext& c, CheckResult& r, const std::vector<int64_t>& prompt, const SpeculativeAnswer& run) {
  std::vector<int64_t> seq = prompt;
  seq.insert(seq.end(), run.ids.begin(), run.ids.end());
  seq.insert(seq.end(), run.then_ids.begin(), run.then_ids.end());
  const int64_t T0 = static_cast<int64_t>(prompt.size());
  if (!run.logits.defined() && run.top.empty()) {  // the target answers ids alone: they are the verdict
    r.stats["ids_only"] = 1;
    return "";
  }
  if (!run.logits.defined()) return off_reference_top(c, r, seq, T0, run.top);
  at::Tensor got = run.logits;  // (m, V)
  if (run.then_logits.defined()) got = at::cat({got, run.then_logits}, 0);
  const int64_t m = got.size(0);
  const at::Tensor band = band_for(c, seq, T0, m);  // (1, m, V)
  const StepDiffs d = compare_steps(got.unsqueeze(0).to(band.device()), band, T0 - 1, c.tol().logits);
  const Verdict v = judge(d, c.tol());
  r.bound = v.bound;
  r.stats["max_abs_diff"] = std::max(r.stats.count("max_abs_diff") ? r.stats["max_abs_diff"] : 0.0, d.worst);
  if (!v.ok && v.first_over && !r.stats.count("first_over")) r.stats["first_over"] = static_cast<double>(d.first_position) + static_cast<double>(*v.first_over);
  return v.ok ? "" : v.why + " (" + std::to_string(m) + " new ids against our reference over the same sequence)";
}

// A run's logits (m, V) against the target's own plain run's at the same positions (m, V): the verify
// step's width must not change what a position computes. "" when within `tol`, else where it is over.
std::string off_plain(const at::Tensor& got, const at::Tensor& plain, double tol, double& worst) {
  const StepDiffs d = compare_steps(got.unsqueeze(0), plain.unsqueeze(0).to(got.device()), 0, tol);
  worst = std::max(worst, d.worst);
  if (!d.first_position_over) return "";
  const int64_t i = *d.first_position_over;
  return "new id " + std::to_string(i) + "'s logits differ from the plain run's by " + sci(d.diffs[static_cast<size_t>(i)]) +
         " (bound " + sci(tol) + ")";
}

// The first index where two id lists part (the shorter's length when one is a prefix of the other).
size_t parting(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

std::string ids_text(const std::vector<int64_t>& v, size_t from, size_t n) {
  std::string s;
  for (size_t i = from; i < std::min(v.size(), from + n); ++i) s += (s.empty() ? "" : ",") + std::to_string(v[i]);
  return "[" + s + "]";
}

// The target's run of `q`, a wrong answer to it named by the run (`what`): a row makes several.
SpeculativeAnswer speculate(CheckContext& c, const SpeculativeRequest& q, const std::string& what) {
  try {
    return c.target.speculate(q);
  } catch (const CheckFailure& e) {
    throw CheckFailure(what + ": " + e.what());
  }
}

// "" when the target runs `draft` by `rule`; else why not, for a row's skip or its note.
std::string lacks(CheckContext& c, const std::string& draft, AcceptRule rule = AcceptRule::Exact) {
  return c.target.offers().why_not_speculate(draft, rule);
}

// The row skipped, saying why: the target offers none of the runs it needs.
void skip(CheckResult& r, const std::string& why) {
  r.status = Status::Skipped;
  r.detail = "skipped: " + why;
}

// kGreedyRuns as prose: "model at k = 4, ngram at k = 4 over the whole run, ...".
std::string runs_text() {
  std::string s;
  for (const GreedyRun& g : kGreedyRuns)
    s += (s.empty() ? "" : ", ") + run_label(g) + " at k = " + std::to_string(g.k) + (g.whole ? " over the whole run" : "") +
         (g.instead_of ? std::string(" (where ") + g.instead_of + " is not offered)" : "");
  return s + "; the others to " + std::to_string(kShortPast) + " past the window";
}

}  // namespace

// --- spec-greedy ---

namespace {

// spec-greedy's runner-up runs: a greedy run whose trajectory has no near tie meets no engine that keeps a
// draft within a tolerance of the best (the fixture's 600-token run: its narrowest top-2 margin is 6.9e-2).
// So the row looks for near ties: kTieContexts sequences of uniformly drawn ids (a fixed seed, moved by
// --vary), our reference's logits over each, and every prefix a prompt whose next id's top two are as far
// apart as there. The kNearTies narrowest margins over twice the logit bound (a parting within it is a near
// tie, either id right) are each a request of one id with our runner-up as the first draft: plain greedy
// decoding rejects it; an engine keeping a draft within its tolerance of the best keeps it wherever that
// tolerance exceeds the margin. The row says the margins it met.
constexpr int64_t kNearTies = 8;
constexpr int64_t kTieContexts = 32;
constexpr int64_t kTieLength = 256;  // each context's ids (the model's context where shorter)
constexpr uint64_t kTieSeed = 0x7E1E5;

struct NearTie {
  std::vector<int64_t> prompt;
  int64_t best = 0, runner_up = 0;
  double margin = 0;
};

std::vector<NearTie> search_near_ties(CheckContext& c, double floor);

// The ties as kept on disk: [{prompt, best, runner_up, margin}, ...].
nlohmann::json ties_json(const std::vector<NearTie>& ties) {
  nlohmann::json j = nlohmann::json::array();
  for (const NearTie& t : ties) j.push_back({{"prompt", t.prompt}, {"best", t.best}, {"runner_up", t.runner_up}, {"margin", t.margin}});
  return j;
}

// The search is our model's alone (its weights, the variation, the bound): made once per model in a
// process - verify's and inject's runs of one model share it, each fault's spec-greedy included - and
// kept beside the references (TINYGPT_REFERENCE_CACHE) for the next process. Keyed in the process by the
// model object and a digest of its embedding, so a model freed and another made at its address is not
// taken for it.

std::vector<NearTie> near_ties(CheckContext& c, double floor) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, double, uint64_t, double>, std::vector<NearTie>> kept;
  at::NoGradGuard no_grad;
  const double digest = c.model->emb->weight.to(at::kDouble).sum().item<double>();
  const auto key = std::make_tuple(static_cast<const void*>(c.model.get()), digest, c.opts.variation, floor);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (const auto it = kept.find(key); it != kept.end()) return it->second;
  }
  char k[160];
  std::snprintf(k, sizeof k, "near ties: %lld contexts of %lld ids, seed %llu + %llu, the %lld narrowest over %.17g",
                static_cast<long long>(kTieContexts), static_cast<long long>(kTieLength), static_cast<unsigned long long>(kTieSeed),
                static_cast<unsigned long long>(c.opts.variation), static_cast<long long>(kNearTies), floor);
  std::vector<NearTie> found;
  kept_json(
      c.model, "near-ties", k, [&] { return ties_json(search_near_ties(c, floor)); },
      [&](const nlohmann::json& doc) {
        found.clear();
        for (const auto& j : doc)
          found.push_back({j.at("prompt").get<std::vector<int64_t>>(), j.at("best").get<int64_t>(), j.at("runner_up").get<int64_t>(),
                           j.at("margin").get<double>()});
      });
  std::lock_guard<std::mutex> lock(mu);
  return kept.emplace(key, std::move(found)).first->second;
}

std::vector<NearTie> search_near_ties(CheckContext& c, double floor) {
  const Config& cfg = c.model->config();
  const int64_t T = std::min<int64_t>(kTieLength, cfg.context), V = cfg.vocab_size;
  const c10::Device dev = c.opts.prompt.device();
  at::Generator gen = make_generator(at::kCPU, kTieSeed + c.opts.variation);
  const at::Tensor ids = at::randint(V, {kTieContexts, T}, gen, at::TensorOptions().dtype(at::kLong));  // (S, T)
  struct Found {
    double margin;
    int64_t seq, at, best, second;
  };
  std::vector<Found> found;
  at::NoGradGuard no_grad;
  constexpr int64_t kChunk = 4;  // sequences a forward (its logits: kChunk x T x V floats)
  for (int64_t s0 = 0; s0 < kTieContexts; s0 += kChunk) {
    const int64_t b = std::min(kChunk, kTieContexts - s0);
    const at::Tensor logits = c.model->forward(ids.narrow(0, s0, b).to(dev)).to(at::kCPU, at::kDouble);  // (b, T, V)
    const auto [top, arg] = logits.topk(2, -1);                                                            // (b, T, 2)
    const at::Tensor margin = (top.select(2, 0) - top.select(2, 1)).contiguous();                          // (b, T)
    const double* m = margin.data_ptr<double>();
    const at::Tensor a = arg.contiguous();
    const int64_t* x = a.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i)
      for (int64_t t = 1; t < T; ++t)  // prompts of two ids or more
        if (m[i * T + t] > floor) found.push_back({m[i * T + t], s0 + i, t, x[(i * T + t) * 2], x[(i * T + t) * 2 + 1]});
  }
  const size_t keep = std::min<size_t>(kNearTies, found.size());
  std::partial_sort(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(keep), found.end(),
                    [](const Found& p, const Found& q) { return p.margin < q.margin; });
  std::vector<NearTie> out;
  for (size_t j = 0; j < keep; ++j) {
    const Found& f = found[j];
    const at::Tensor row = ids[f.seq].narrow(0, 0, f.at + 1).contiguous();
    out.push_back({std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()), f.best, f.second, f.margin});
  }
  return out;
}

}  // namespace

void spec_greedy_check(CheckContext& c, CheckResult& r) {
  const Generation& main = c.main();
  const std::vector<int64_t> prompt = prompt_of(c);
  const int64_t T0 = static_cast<int64_t>(prompt.size()), n = c.opts.tokens;
  const std::vector<int64_t> all = row0(main.seq);
  const std::vector<int64_t> plain_ids(all.begin() + T0, all.end());
  const at::Tensor band = c.main_reference().band.select(0, 0);  // (n, V): our reference over the plain run
  std::string summary, skipped, ran;
  int runs = 0;
  // One run judged: plain greedy id for id (a parting at a near tie within the bound's reach forgiven),
  // the logits up to the parting our reference's. False, with the row failed, when it is not.
  auto holds = [&](const SpeculativeAnswer& run, int64_t len, const std::string& what) {
    const std::vector<int64_t> plain(plain_ids.begin(), plain_ids.begin() + len);
    const size_t at = parting(run.ids, plain);
    const bool parted = at < plain.size() || run.ids.size() != plain.size();
    // The logits up to the parting (its own position too: the sequence before it is the same), by the bound in force.
    SpeculativeAnswer judged = run;
    const int64_t m = std::min<int64_t>(static_cast<int64_t>(at) + 1, static_cast<int64_t>(run.ids.size()));
    judged.ids.resize(static_cast<size_t>(m));
    if (run.logits.defined()) judged.logits = run.logits.narrow(0, 0, m);
    else if (!run.top.empty()) judged.top.resize(static_cast<size_t>(m));
    const std::string off = off_reference(c, r, prompt, judged);
    if (!off.empty()) {
      set_result(r, false, what + ": the verify step's logits are not a one-token step's: " + off);
      return false;
    }
    // Judged by the distribution (--max-kl, --min-top1), the logits are the verdict: the ids may part where
    // they allow. Otherwise the ids are plain greedy's, but at a near-tie within the bound's reach.
    if (c.tol().by_distribution() || !parted) return true;
    const double margin = at < plain.size() ? top2_margin(band[static_cast<int64_t>(at)]) : 0;
    if (at < run.ids.size() && margin <= 2 * c.tol().logits) return true;
    // A target that chose a wrong id computes on from it: the logits after it are our reference's over
    // the ids it answered. One whose answer is not the ids it decoded (an adapter reading the drafts'
    // list) computes on from others: the first id after the parting is off.
    if (at + 1 < run.ids.size()) {
      CheckResult whole;
      const std::string after = off_reference(c, whole, prompt, run);
      if (!after.empty()) {
        set_result(r, false, what + ": the ids answered part from plain greedy at new id " + std::to_string(at) + " (" +
                                 ids_text(run.ids, at, 4) + " against " + ids_text(plain, at, 4) +
                                 ") and the logits after them are not our reference's over those ids: the answer's ids are not "
                                 "the ones the target decoded (" + after + ")");
        r.stats["max_abs_diff"] = whole.stats["max_abs_diff"];
        if (whole.stats.count("first_over")) r.stats["first_over"] = whole.stats["first_over"];
        return false;
      }
    }
    set_result(r, false, what + ": the ids part from plain greedy at new id " + std::to_string(at) + " (position " +
                             std::to_string(T0 + static_cast<int64_t>(at)) + "): " + ids_text(run.ids, at, 4) + " against " +
                             ids_text(plain, at, 4) + (at < plain.size() ? ", the reference's top-2 margin there " + sci(margin) : "") +
                             "; " + std::to_string(run.ids.size()) + " ids of " + std::to_string(len));
    r.stats["first_over"] = static_cast<double>(T0 + static_cast<int64_t>(at) - 1);
    return false;
  };
  for (const GreedyRun& g : kGreedyRuns) {
    const std::string draft = g.draft;
    const int64_t k = g.k;
    if (draft == "model" && !c.opts.draft) {
      skipped = "; no trained draft (golden/draft.safetensors): the model draft left out";
      continue;
    }
    if (g.instead_of && lacks(c, g.instead_of).empty()) continue;
    if (const std::string why = lacks(c, draft); !why.empty()) {
      if (skipped.find(why) == std::string::npos) skipped += "; " + why + ": its runs left out";
      continue;
    }
    const int64_t len = g.whole ? n : std::min(n, c.model->config().context + kShortPast);
    SpeculativeRequest q = request(c, draft, len, greedy_settings(k));
    if (g.wrong_every) q.replay_shift = 1, q.replay_period = g.wrong_every;
    const std::string label = run_label(g);
    const std::string what = label + " draft at k = " + std::to_string(k);
    const SpeculativeAnswer run = speculate(c, q, what);
    ++runs;
    ran += (ran.empty() ? "" : ", ") + what + (g.whole ? " over the whole run" : "");
    if (!holds(run, len, what)) return;
    const bool parted = run.ids.size() != static_cast<size_t>(len) || parting(run.ids, plain_ids) < static_cast<size_t>(len);
    if (!c.tol().by_distribution() && !parted && draft == "replay" && !g.wrong_every && run.accepted != run.drafted) {
      set_result(r, false, what + ": " + std::to_string(run.accepted) + " of " + std::to_string(run.drafted) +
                               " drafts accepted of the target's own greedy ids at temperature 0 (every one is right)");
      return;
    }
    if (k == kMainK) {
      std::string key = label;
      std::replace(key.begin(), key.end(), ' ', '_');
      summary += (summary.empty() ? "" : ", ") + label + " " + pct(run.acceptance());
      r.stats["acceptance_" + key] = run.acceptance();
      r.stats["mean_accepted_length_" + key] = run.mean_accepted_length();
    }
  }
  // Our runner-up drafted at the narrowest margins found, under each rule the target offers at temperature 0.
  std::string ties_text;
  if (lacks(c, "replay").empty() && !c.tol().by_distribution()) {
    const std::vector<NearTie> ties = near_ties(c, 2 * c.tol().logits);
    r.stats["near_ties"] = static_cast<double>(ties.size());
    std::vector<std::string> rules;
    for (const AcceptRule rule : {AcceptRule::Exact, AcceptRule::SampleAndMatch}) {
      if (ties.empty() || !lacks(c, "replay", rule).empty()) continue;
      rules.push_back(accept_rule_name(rule));
      SpeculativeSettings s = greedy_settings(kMainK);
      s.rule = rule;
      for (const NearTie& t : ties) {
        SpeculativeRequest q = request(c, "replay", 1, s, 0, t.prompt);
        q.replay = t.prompt;
        q.replay.push_back(t.runner_up);
        const std::string what = std::string("the runner-up drafted after a prompt of ") + std::to_string(t.prompt.size()) +
                                 " drawn ids, " + accept_rule_name(rule);
        const SpeculativeAnswer run = speculate(c, q, what);
        ++runs;
        if (run.ids.size() == 1 && run.ids[0] == t.runner_up) {
          set_result(r, false, what + ": the draft was kept - id " + std::to_string(t.runner_up) + " where greedy decoding gives " +
                                   std::to_string(t.best) + ", our reference's top two " + sci(t.margin) +
                                   " apart (a draft accepted within a tolerance of the best at temperature 0)");
          r.stats["first_over"] = static_cast<double>(t.prompt.size()) - 1;
          r.stats["near_tie_margin"] = t.margin;
          return;
        }
        if (run.ids.size() != 1 || run.ids[0] != t.best) {
          set_result(r, false, what + ": answered " + ids_text(run.ids, 0, 4) + " for one id where greedy decoding gives " +
                                   std::to_string(t.best) + " (our reference's top two " + sci(t.margin) + " apart)");
          r.stats["first_over"] = static_cast<double>(t.prompt.size()) - 1;
          return;
        }
        if (const std::string off = off_reference(c, r, t.prompt, run); !off.empty()) {
          set_result(r, false, what + ": " + off);
          return;
        }
      }
    }
    if (ties.empty()) {
      ties_text = "; no top-2 margin over " + sci(2 * c.tol().logits) + " after drawn ids: the runner-up runs left out";
    } else if (!rules.empty()) {
      r.stats["near_tie_narrowest"] = ties.front().margin;
      r.stats["near_tie_widest"] = ties.back().margin;
      ran += (ran.empty() ? "" : ", ") + std::to_string(ties.size() * rules.size()) + " one-id runs drafting our runner-up";
      ties_text = "; our runner-up drafted after " + std::to_string(ties.size()) + " prompts of drawn ids whose next id's top two are " +
                  sci(ties.front().margin) + " to " + sci(ties.back().margin) + " apart, rejected each (" + join(rules) +
                  "): an engine keeping a draft within more than " + sci(ties.front().margin) +
                  " of the best at temperature 0 keeps one of them";
    }
  }
  if (runs == 0) return skip(r, skipped.substr(2));
  r.figure = r.stats["max_abs_diff"];
  const std::string judged = r.stats.count("ids_only") ? std::string("the target answers ids alone: ids judged, no logits")
                                                       : "every new id's logits within " + sci(c.tol().logits) + " of the reference (worst " +
                                                             sci(r.stats["max_abs_diff"]) + ")";
  set_result(r, true, std::to_string(runs) + " speculative runs (" + ran + "; the runs not over the whole run to " +
                          std::to_string(kShortPast) + " past the window), each plain greedy id for id, " + judged + "; accepted at k = " +
                          std::to_string(kMainK) + ": " + summary + ties_text + skipped);
}

// --- spec-seeded ---

void spec_seeded_check(CheckContext& c, CheckResult& r) {
  const std::vector<int64_t> prompt = prompt_of(c);
  const int64_t T0 = static_cast<int64_t>(prompt.size());
  const int64_t n = std::min(c.opts.tokens, c.model->config().context + 32);
  SpeculativeSettings s;
  s.k = kSeededK;
  s.rule = AcceptRule::SampleAndMatch;
  s.sampling = c.opts.sampling;
  s.seed = c.opts.sampling_seed;
  // Plain seeded decoding with the target's own sampler and stream: our production loop, or an engine's
  // own loop (its 'speculate' with no drafts).
  if (const std::string why = lacks(c, "none", s.rule); !why.empty()) return skip(r, why + " (plain seeded decoding to hold it to)");
  std::string left_out;
  std::vector<const char*> drafts;
  for (const char* draft : kSeededDrafts) {
    if (const std::string why = lacks(c, draft, s.rule); !why.empty()) left_out += "; " + why;
    else drafts.push_back(draft);
  }
  if (drafts.empty()) return skip(r, left_out.substr(2));
  const at::Tensor p = at::tensor(prompt, at::kLong).unsqueeze(0).to(c.opts.prompt.device());
  const Generation plain = c.target.seeded(p, n, s.sampling, s.seed);
  const std::vector<int64_t> all = row0(plain.seq), want(all.begin() + T0, all.end());
  double worst = 0;
  std::string summary;
  int64_t drafted = 0;
  bool top_only = false;
  for (const char* draft : drafts) {
    SpeculativeRequest q = request(c, draft, n, s);
    if (q.draft == "replay") q.replay = all;  // the plain seeded run: always right
    const SpeculativeAnswer run = speculate(c, q, std::string(draft) + " draft, sample-and-match");
    const size_t at = parting(run.ids, want);
    if (at < want.size() || run.ids.size() != want.size()) {
      set_result(r, false, std::string(draft) + " draft, sample-and-match, seed " + std::to_string(s.seed) +
                               ": the ids part from plain seeded decoding at new id " + std::to_string(at) + ": " +
                               ids_text(run.ids, at, 4) + " against " + ids_text(want, at, 4));
      r.stats["first_over"] = static_cast<double>(T0 + static_cast<int64_t>(at) - 1);
      return;
    }
    if (!run.logits.defined() || !plain.logits.defined()) {
      top_only = true;  // an engine that gives top-N log-probabilities only: its ids are the verdict
    } else if (const std::string off = off_plain(run.logits, plain.logits.select(0, 0), c.tol().self, worst); !off.empty()) {
      set_result(r, false, std::string(draft) + " draft, sample-and-match: " + off);
      return;
    }
    summary += (summary.empty() ? "" : ", ") + std::string(draft) + " " + pct(run.acceptance()) + " of " + std::to_string(run.drafted);
    drafted += run.drafted;
  }
  if (drafted == 0)  // equal to plain decoding, and nothing speculative judged
    return skip(r, "the target drafted nothing in " + std::to_string(n) + " ids at " + s.sampling.to_string() + " (" + summary +
                       " drafts accepted): its ids equal plain seeded decoding's, with no round to judge" + left_out);
  r.figure = worst;
  set_result(r, true, "sample-and-match at " + s.sampling.to_string() + ", seed " + std::to_string(s.seed) + ", k = " +
                          std::to_string(kSeededK) + ": " + std::to_string(n) + " ids equal to plain seeded decoding's for each draft (" +
                          summary + " drafts accepted); " +
                          (top_only ? std::string("the target answers no logits: its ids are the verdict")
                                    : "each id's logits within " + sci(c.tol().self) + " of the plain run's (worst " + sci(worst) + ")") +
                          left_out);
}

// --- spec-stops ---

void spec_stops_check(CheckContext& c, CheckResult& r) {
  if (const std::string why = lacks(c, "replay"); !why.empty()) return skip(r, why + " (blocks accepted whole where the row puts its stop)");
  const Generation& main = c.main();
  const std::vector<int64_t> prompt = prompt_of(c);
  const int64_t T0 = static_cast<int64_t>(prompt.size());
  const std::vector<int64_t> all = row0(main.seq), plain(all.begin() + T0, all.end());
  double worst = 0;
  // A stop id accepted inside the first block: the first id of the plain run, from its third on, seen
  // there for the first time (not the round's last id, the one the target adds); in a run of one
  // repeated id, that id, which ends the output at its first id (the first of a block all the same).
  size_t at = 2;
  while (at < plain.size() &&
         (std::find(plain.begin(), plain.begin() + static_cast<int64_t>(at), plain[at]) != plain.begin() + static_cast<int64_t>(at) ||
          (at + 1) % static_cast<size_t>(kStopK + 1) == 0))
    ++at;
  if (at >= std::min<size_t>(plain.size(), kStopK)) at = 0;
  const int64_t then = std::min<int64_t>(kThenPlain, c.opts.tokens - static_cast<int64_t>(std::max<size_t>(at + 1, kBudget)));
  if (static_cast<int64_t>(plain.size()) < kBudget || then < 1) {
    r.status = Status::Skipped;
    r.detail = "the run is too short: " + std::to_string(kBudget + 1) + " ids or more are needed";
    return;
  }
  SpeculativeSettings s = greedy_settings(kStopK);
  s.stop = {plain[at]};
  const SpeculativeRun stopped = c.target.speculate(request(c, "replay", c.opts.tokens, s, then));
  const std::vector<int64_t> want(plain.begin(), plain.begin() + static_cast<int64_t>(at) + 1);
  if (stopped.ids != want) {
    set_result(r, false, "stop id " + std::to_string(plain[at]) + " (new id " + std::to_string(at) + ", accepted inside a block of " +
                             std::to_string(kStopK) + "): the output was " + std::to_string(stopped.ids.size()) + " ids " +
                             ids_text(stopped.ids, at, 4) + "..., not the " + std::to_string(want.size()) + " ids up to the stop");
    r.stats["first_over"] = static_cast<double>(T0 + static_cast<int64_t>(std::min(at + 1, stopped.ids.size())) - 1);
    return;
  }
  // Plain steps after it go on as plain decoding did: the cache holds exactly the ids emitted.
  const at::Tensor plain_logits = main.logits.select(0, 0);  // (n, V)
  auto goes_on = [&](const SpeculativeRun& run, const std::string& what) {
    const size_t from = run.ids.size();
    const std::vector<int64_t> next(plain.begin() + static_cast<int64_t>(from), plain.begin() + static_cast<int64_t>(from + run.then_ids.size()));
    if (run.then_ids != next) {
      set_result(r, false, "plain steps after " + what + ": " + ids_text(run.then_ids, 0, 4) + " against plain greedy's " + ids_text(next, 0, 4));
      r.stats["first_over"] = static_cast<double>(T0 + static_cast<int64_t>(from) - 1);
      return false;
    }
    const at::Tensor got = at::cat({run.logits, run.then_logits}, 0);  // (m, V)
    const std::string off = off_plain(got, plain_logits.narrow(0, 0, got.size(0)), c.tol().self, worst);
    if (!off.empty()) set_result(r, false, "a run with " + what + " and plain steps after it against the plain run: " + off);
    return off.empty();
  };
  if (!goes_on(stopped, "a stop inside a block")) return;
  const SpeculativeRun budget = c.target.speculate(request(c, "replay", kBudget, greedy_settings(kStopK), then));
  if (budget.ids != std::vector<int64_t>(plain.begin(), plain.begin() + kBudget)) {
    set_result(r, false, "a budget of " + std::to_string(kBudget) + " ids (inside the second block of " + std::to_string(kStopK + 1) +
                             "): the output was " + std::to_string(budget.ids.size()) + " ids");
    r.stats["first_over"] = static_cast<double>(T0 + std::min<int64_t>(kBudget, static_cast<int64_t>(budget.ids.size())) - 1);
    return;
  }
  if (!goes_on(budget, "a budget inside a block")) return;
  // The penalty's history: the accepted ids, never the drafted ones.
  const int64_t np = std::min(kPenaltyTokens, c.opts.tokens);
  SpeculativeSettings pen = greedy_settings(4);
  pen.sampling.penalty = kPenalty;
  const at::Tensor p = at::tensor(prompt, at::kLong).unsqueeze(0).to(c.opts.prompt.device());
  const Generation plain_pen = c.target.generate(p, np, sampler(pen.sampling));
  const std::vector<int64_t> pall = row0(plain_pen.seq), pwant(pall.begin() + T0, pall.end());
  SpeculativeRequest pq = request(c, "replay", np, pen);
  pq.replay = pall;  // the plain run with the penalty: always right
  const SpeculativeRun penalised = c.target.speculate(pq);
  const size_t pat = parting(penalised.ids, pwant);
  if (pat < pwant.size() || penalised.ids.size() != pwant.size()) {
    set_result(r, false, "greedy with penalty " + std::to_string(kPenalty).substr(0, 3) + ": the ids part from plain decoding's at new id " + std::to_string(pat) +
                             ": " + ids_text(penalised.ids, pat, 4) + " against " + ids_text(pwant, pat, 4));
    r.stats["first_over"] = static_cast<double>(T0 + static_cast<int64_t>(pat) - 1);
    return;
  }
  r.figure = worst;
  set_result(r, true, "stop id " + std::to_string(plain[at]) + " accepted at new id " + std::to_string(at) + " inside a block of " +
                          std::to_string(kStopK) + " ends the output there, a budget of " + std::to_string(kBudget) +
                          " gives " + std::to_string(kBudget) + " ids, and " + std::to_string(then) +
                          " plain steps after each go on as plain greedy decoding (logits within " + sci(c.tol().self) + " of its, worst " + sci(worst) +
                          "); with penalty " + std::to_string(kPenalty).substr(0, 3) + ", " +
                          std::to_string(np) + " greedy ids equal plain decoding's");
}

// --- spec-cache ---

void spec_cache_check(CheckContext& c, CheckResult& r) {
  const std::vector<int64_t> prompt = prompt_of(c);
  const int64_t T0 = static_cast<int64_t>(prompt.size());
  if (const std::string why = lacks(c, "replay"); !why.empty()) return skip(r, why + " (a draft never right)");
  // Rounds that reject every draft until past the window, then plain steps on the same cache.
  const int64_t total = std::min(c.opts.tokens, c.model->config().context + kPastTheWindow);
  const int64_t then = std::min<int64_t>(kThenPlain, total - 1), n = total - then;
  SpeculativeRequest q = request(c, "replay", n, greedy_settings(kCacheK), then);
  q.replay_shift = 1;  // every id moved by one: never right
  const SpeculativeAnswer run = c.target.speculate(q);
  r.stats["acceptance_never_right"] = run.acceptance();
  if (!c.tol().by_distribution() && run.accepted != 0) {
    set_result(r, false, std::to_string(run.accepted) + " drafts accepted of a draft that is never the argmax");
    return;
  }
  // Judged over the run's own sequence: entries left behind or a window not restored move the logits.
  const std::string off = off_reference(c, r, prompt, run);
  if (!off.empty()) {
    set_result(r, false, "after " + std::to_string(run.rounds) + " rounds that rejected " + std::to_string(run.drafted) +
                             " drafts, the rounds and the plain steps on the same cache: " + off);
    return;
  }
  r.figure = r.stats["max_abs_diff"];
  set_result(r, true, std::to_string(run.rounds) + " rounds rejected all " + std::to_string(run.drafted) + " drafts (k = " +
                          std::to_string(kCacheK) + ") to position " + std::to_string(T0 + n) + "; they and " + std::to_string(then) +
                          " plain steps on the same cache within " + sci(c.tol().logits) + " of our reference (worst " +
                          sci(*r.figure) + ")");
}

// --- spec-distribution ---

namespace {

// The chi-square's upper quantile at `alpha` (Wilson-Hilferty; slightly above the exact one at small df).
double chi2_critical(int64_t df, double z) {
  const double d = static_cast<double>(df), a = 2.0 / (9.0 * d);
  return d * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

// One chi-square test: observed counts against expected ones, cells of expected >= 5, the rest pooled.
struct ChiSquare {
  std::string name;
  int64_t draws = 0, df = 0;
  double statistic = 0, critical = 0, power_sigmas = 0;  // power: (lambda + df - critical) / sd at D = kBias
  struct Impossible {
    int64_t first = 0, second = -1;  // the outcome (second: -1 for a single id)
    int64_t times = 0;
  };
  std::vector<Impossible> impossible;  // outcomes of probability 0 that were drawn
  bool ok() const { return statistic <= critical; }
};

std::pair<int64_t, int64_t> outcome(int64_t key) { return {key, -1}; }
std::pair<int64_t, int64_t> outcome(const std::pair<int64_t, int64_t>& key) { return key; }

template <class Key>
ChiSquare chi_square(const std::string& name, const std::map<Key, double>& expected, const std::map<Key, int64_t>& observed, int64_t draws) {
  ChiSquare t;
  t.name = name;
  t.draws = draws;
  double rest_e = 0, rest_o = 0;
  int64_t cells = 0;
  for (const auto& [key, e] : expected) {
    const auto it = observed.find(key);
    const double o = it == observed.end() ? 0.0 : static_cast<double>(it->second);
    if (e >= 5) {
      t.statistic += (o - e) * (o - e) / e;
      ++cells;
    } else {
      rest_e += e, rest_o += o;
    }
  }
  for (const auto& [key, o] : observed)  // an outcome of probability 0 goes to the rest
    if (!expected.count(key)) rest_o += static_cast<double>(o), t.impossible.push_back({outcome(key).first, outcome(key).second, o});
  if (rest_e >= 5 || (rest_o > 0 && rest_e > 0)) {
    t.statistic += (rest_o - rest_e) * (rest_o - rest_e) / std::max(rest_e, 1e-12);
    ++cells;
  }
  // An outcome drawn where the probability is 0 is decisive whatever the counts: no pooling dilutes it.
  if (!t.impossible.empty()) t.statistic = std::numeric_limits<double>::infinity();
  t.df = std::max<int64_t>(1, cells - 1);
  t.critical = chi2_critical(t.df, kZFalseAlarm);
  const double lambda = kBias * static_cast<double>(draws), df = static_cast<double>(t.df);
  t.power_sigmas = (lambda + df - t.critical) / std::sqrt(2 * (df + 2 * lambda));
  return t;
}

// The bias D a test of `t.draws` draws finds with kSigmas of power: lambda = D x draws solving
// (lambda + df - critical) / sqrt(2 (df + 2 lambda)) = kSigmas (the larger root).
double bias_at_power(const ChiSquare& t) {
  const double df = static_cast<double>(t.df), a = t.critical - df, s2 = kSigmas * kSigmas;
  const double lambda = a + 2 * s2 + std::sqrt((a + 2 * s2) * (a + 2 * s2) - a * a + 2 * s2 * df);
  return lambda / static_cast<double>(std::max<int64_t>(1, t.draws));
}

// A test's line: its statistic and its power at D = kBias; a test its draws do not size for kBias (the one
// after a rejection runs on the share of draws that had one) says the bias it does find with kSigmas.
std::string chi_text(const ChiSquare& t) {
  char b[320];
  std::snprintf(b, sizeof b, "%s: chi2 %.1f, df %lld, critical %.1f (%lld draws, power %.1f sigma at D = %.2f", t.name.c_str(), t.statistic,
                static_cast<long long>(t.df), t.critical, static_cast<long long>(t.draws), t.power_sigmas, kBias);
  std::string out = b;
  if (t.power_sigmas < kSigmas) {
    std::snprintf(b, sizeof b, "; not sized for it: %.0f sigma at D = %.3f", kSigmas, bias_at_power(t));
    out += b;
  }
  return out + ")";
}

// The target's distribution of the id after `seq` through the sampler pipeline, from our uncached model.
at::Tensor exact_probs(GPT& model, const std::vector<int64_t>& seq, const SamplingSettings& s) {
  const at::Tensor ids = at::tensor(seq, at::kLong).unsqueeze(0).to(model->emb->weight.device());  // (1, T)
  const at::Tensor last = model->forward_last(ids.size(1) > model->config().context ? ids.narrow(1, ids.size(1) - model->config().context,
                                                                                                   model->config().context)
                                                                                      : ids);  // (1, V)
  return pipeline_probs(last[0], ids, s).to(at::kCPU, at::kDouble);  // (V)
}

// What `times` draws after a rejected draft should give, id by id: times x norm(max(0, p - q)) (p, q: (V)
// double). An id whose p and q are equal but for float arithmetic (p >= 0.999 q) may come after a
// rejection in an engine that computes them otherwise: it is given a share too small to count, not ruled out.
std::map<int64_t, double> after_rejection(const at::Tensor& p, const at::Tensor& q, double times) {
  const at::Tensor pc = p.contiguous(), qc = q.contiguous(), res = (pc - qc).clamp_min(0);  // (V)
  const double mass = res.sum().item<double>();
  const double *pv = pc.data_ptr<double>(), *qv = qc.data_ptr<double>(), *rv = res.data_ptr<double>();
  std::map<int64_t, double> e;
  for (int64_t y = 0; y < pc.size(0); ++y) {
    if (mass > 0 && rv[y] > 0) e[y] = times * rv[y] / mass;
    else if (pv[y] > 0 && pv[y] >= 0.999 * qv[y]) e[y] = 1e-9;
  }
  return e;
}

}  // namespace

void spec_distribution_check(CheckContext& c, CheckResult& r) {
  std::vector<int64_t> prompt = prompt_of(c);
  {
    const std::vector<int64_t> main = row0(c.main().seq);
    const int64_t more = std::min<int64_t>(kDistributionContext, static_cast<int64_t>(main.size() - prompt.size()));
    prompt.insert(prompt.end(), main.begin() + static_cast<int64_t>(prompt.size()), main.begin() + static_cast<int64_t>(prompt.size()) + more);
  }
  SpeculativeSettings s;
  s.k = kDistributionK;
  s.sampling = c.opts.sampling;
  const std::string draft = c.opts.draft && lacks(c, "model").empty() ? "model" : "self";
  if (const std::string why = lacks(c, draft); !why.empty()) return skip(r, why);
  // The exact distributions: the first id's, the second's after each first id, and (with a draft
  // model) the draft's first, whose residual norm(max(0, p - q)) a rejected first draft leaves.
  const at::Tensor p1 = exact_probs(c.model, prompt, s.sampling);  // (V)
  std::map<int64_t, at::Tensor> p2;
  std::map<int64_t, double> e1;
  std::vector<int64_t> support;
  for (int64_t x = 0; x < p1.size(0); ++x)
    if (p1[x].item<double>() > 0) support.push_back(x), e1[x] = p1[x].item<double>();
  for (int64_t x : support) {
    std::vector<int64_t> seq = prompt;
    seq.push_back(x);
    p2[x] = exact_probs(c.model, seq, s.sampling);
  }
  at::Tensor q1;  // (V) the draft's first distribution, with a draft model
  if (draft == "model") {
    GPT draft_model = c.opts.draft;
    q1 = exact_probs(draft_model, prompt, s.sampling);
  }
  // Draws: enough that the joint's test has kSigmas of power at D = kBias (its cells set its df).
  // The second id's probabilities after each first one, as (y, p) pairs with p > 0.
  std::map<int64_t, std::vector<std::pair<int64_t, double>>> second;
  for (int64_t x : support) {
    const at::Tensor q = p2.at(x).contiguous();
    const double* v = q.data_ptr<double>();
    for (int64_t y = 0; y < q.size(0); ++y)
      if (v[y] > 0) second[x].emplace_back(y, v[y]);
  }
  auto joint_expected = [&](double scale, const std::function<double(int64_t)>& first) {
    std::map<std::pair<int64_t, int64_t>, double> e;
    for (int64_t x : support) {
      const double f = first(x);
      if (f <= 0) continue;
      for (const auto& [y, v] : second.at(x)) e[{x, y}] = scale * f * v;
    }
    return e;
  };
  // Draws: enough that each position's test - the first id's and the first two's - has kSigmas of power
  // at D = kBias (their cells set their df; the joint's needs more). The test after a rejection runs on
  // the share of draws that have one, its power said as it is.
  int64_t N = c.opts.spec_draws;
  if (N == 0) {
    const std::map<std::pair<int64_t, int64_t>, int64_t> none;
    for (N = 2000; N < 1000000; N = N * 5 / 4) {
      const auto joint = joint_expected(static_cast<double>(N), [&](int64_t x) { return e1.at(x); });
      if (chi_square("joint", joint, none, N).power_sigmas >= kSigmas) break;
    }
  }
  std::map<int64_t, int64_t> o1;
  std::map<int64_t, int64_t> orej;  // the id drawn after a rejected first draft
  std::map<std::pair<int64_t, int64_t>, int64_t> o12;
  // Runs of three: the first id comes from the engine's step over the prompt, the draft is for the second
  // (why runs of two drafted nothing); after its rejection, (first id, second id), and the rejections by first id.
  std::map<std::pair<int64_t, int64_t>, int64_t> orej2;
  std::map<int64_t, int64_t> rejected_after;
  int64_t rejected = 0, drafted = 0, accepted = 0;
  // Runs of two ids; an engine that drafts only where the budget leaves room for the id after the drafts
  // (llama-server) drafts nothing there, and gets runs of three: the first two ids are judged either way
  // (a lossless run's first two are the target's whatever comes after).
  int64_t budget = 2;
  for (int64_t i = 0; i < N; ++i) {
    s.seed = static_cast<uint64_t>(i);
    const SpeculativeRun run = c.target.speculate(request(c, draft, budget, s, 0, prompt));
    if (static_cast<int64_t>(run.ids.size()) != budget) {
      set_result(r, false, "draw " + std::to_string(i) + ": " + std::to_string(run.ids.size()) + " ids for a budget of " + std::to_string(budget));
      return;
    }
    ++o1[run.ids[0]];
    ++o12[{run.ids[0], run.ids[1]}];
    drafted += run.drafted, accepted += run.accepted;
    // The first round rejected: from its rounds, or, where the engine gives its counts alone, from a run
    // with one draft in all (so one round). A run that drafted nothing rejected nothing.
    const bool first_rejected = run.drafted > 0 && (!run.accepted_per_round.empty() ? run.accepted_per_round[0] == 0
                                                                                    : run.drafted == 1 && run.accepted == 0);
    if (first_rejected && budget == 2) ++rejected, ++orej[run.ids[0]];
    if (first_rejected && budget == 3) ++rejected, ++orej2[{run.ids[0], run.ids[1]}], ++rejected_after[run.ids[0]];
    if (c.progress && N >= 10000 && (i + 1) % (N / 10) == 0)
      c.progress(std::string(check::kSpecDistribution) + ": " + std::to_string(i + 1) + " of " + std::to_string(N) + " draws");
    if (i + 1 == kProbeDraws && drafted == 0 && budget == 2) {
      budget = 3, i = -1;
      o1.clear(), o12.clear(), orej.clear(), rejected = 0;
    }
  }
  if (drafted == 0)  // plain sampling's distribution, nothing speculative judged
    return skip(r, "the target drafted nothing in " +
                       (budget == 2 ? std::to_string(N) + " runs of two ids"
                                    : std::to_string(kProbeDraws) + " runs of two ids nor in " + std::to_string(N) + " of three") +
                       " (" + draft + " draft, exact rule at " + s.sampling.to_string() +
                       "): its draws are plain sampling's, no round to judge");
  std::vector<ChiSquare> tests;
  std::map<int64_t, double> e1n;
  for (const auto& [x, p] : e1) e1n[x] = p * static_cast<double>(N);
  tests.push_back(chi_square("first id", e1n, o1, N));
  tests.push_back(chi_square("first two ids", joint_expected(static_cast<double>(N), [&](int64_t x) { return e1.at(x); }), o12, N));
  std::map<int64_t, at::Tensor> q2;  // runs of three: the draft's second distribution after each first id rejected after
  if (q1.defined() && rejected > 0 && budget == 2)
    tests.push_back(chi_square("the id after a rejected first draft", after_rejection(p1, q1, static_cast<double>(rejected)), orej, rejected));
  if (q1.defined() && rejected > 0 && budget == 3) {
    // The second id after its draft was rejected, against norm(max(0, p - q)) after the first id each came
    // after (the draws rejected after x, times x's residual); an x we rule out is the first id's test's.
    GPT draft_model = c.opts.draft;
    std::map<std::pair<int64_t, int64_t>, double> er;
    for (const auto& [x, times] : rejected_after) {
      if (!p2.count(x)) continue;
      std::vector<int64_t> seq = prompt;
      seq.push_back(x);
      q2[x] = exact_probs(draft_model, seq, s.sampling);
      for (const auto& [y, e] : after_rejection(p2.at(x), q2.at(x), static_cast<double>(times))) er[{x, y}] = e;
    }
    tests.push_back(chi_square("the second id after a rejected draft of it", er, orej2, rejected));
  }
  // Where an id came that our probabilities rule out: its probability under each side and its rank in
  // each model's raw scores, so a top-k / top-p edge (float arithmetic keeping or cutting one id) can be
  // told from a wrong rule.
  const at::Tensor q_raw = draft == "model" ? [&] {
    GPT dm = c.opts.draft;
    const at::Tensor ids = at::tensor(prompt, at::kLong).unsqueeze(0).to(dm->emb->weight.device());
    return dm->forward_last(ids)[0].to(at::kCPU, at::kDouble);  // (V)
  }() : at::Tensor();
  const at::Tensor p_raw = [&] {
    const at::Tensor ids = at::tensor(prompt, at::kLong).unsqueeze(0).to(c.model->emb->weight.device());
    return c.model->forward_last(ids)[0].to(at::kCPU, at::kDouble);  // (V)
  }();
  auto rank_of = [](const at::Tensor& raw, int64_t x) { return (raw > raw[x]).sum().item<int64_t>() + 1; };
  auto impossible_text = [&](const ChiSquare& t) {
    std::string out;
    for (const auto& [x, y, times] : t.impossible) {
      char b[240];
      if (y >= 0) {  // a pair: the second id's probabilities after the first
        std::snprintf(b, sizeof b, "ids %lld, %lld drawn %lld times: our p %.3g then %.3g", static_cast<long long>(x), static_cast<long long>(y),
                      static_cast<long long>(times), p1[x].item<double>(), p2.count(x) ? p2.at(x)[y].item<double>() : 0.0);
        out += (out.empty() ? "" : ", ") + std::string(b);
        if (q2.count(x)) {
          std::snprintf(b, sizeof b, ", q then %.3g", q2.at(x)[y].item<double>());
          out += b;
        }
        continue;
      }
      std::snprintf(b, sizeof b, "id %lld drawn %lld times: our p %.3g (rank %lld)", static_cast<long long>(x), static_cast<long long>(times),
                    p1[x].item<double>(), static_cast<long long>(rank_of(p_raw, x)));
      out += (out.empty() ? "" : ", ") + std::string(b);
      if (q_raw.defined() && q1.defined()) {
        std::snprintf(b, sizeof b, ", q %.3g (rank %lld)", q1[x].item<double>(), static_cast<long long>(rank_of(q_raw, x)));
        out += b;
      }
    }
    return out.empty() ? out : " [outcomes of probability 0 under ours: " + out + "]";
  };
  std::string lines;
  bool ok = true;
  for (const auto& t : tests) {
    lines += (lines.empty() ? "" : "; ") + chi_text(t) + impossible_text(t);
    ok = ok && t.ok();
    r.stats["chi2_" + std::to_string(&t - tests.data())] = t.statistic;
  }
  r.stats["draws"] = static_cast<double>(N);
  r.stats["acceptance"] = drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0;
  r.figure = tests.front().statistic;
  const std::string what = "exact rule at " + s.sampling.to_string() + ", k = " + std::to_string(kDistributionK) + ", after " +
                           std::to_string(prompt.size()) + " ids, " +
                           (budget == 3 ? "runs of three ids (none drafted in runs of two), " : "") + draft +
                           " draft (" + pct(drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0) +
                           " accepted, first draft rejected in " + std::to_string(rejected) + " draws" +
                           (draft == "model" ? "" : "; no trained draft: the target's own weights, so no rejection is tested") + "): ";
  // The output's distribution held (the first id and the first two) while the ids after a rejection are not
  // what the draft under the request's sampler leaves: the target drafts from another distribution than the
  // one asked for. Still exact, but not this rule with this draft (acceptance is what it costs).
  const bool output_held = tests.size() == 3 && tests[0].ok() && tests[1].ok() && !tests[2].ok();
  set_result(r, ok,
             what + lines + (ok ? "" : " - over the critical value at a false alarm rate of 1e-6") +
                 (output_held ? "; the first id and the first two are the target's distribution: the target drafts from another "
                                "distribution than this draft under the request's sampler"
                              : ""));
}

// --- The rows of the check table (check_table.cpp lists them) ---

namespace {
// Notation the rows' prose uses, written once: the rule's formulas are not numbers a row runs with.
const char* const kExactRule = "the exact rule (accept a draft x with probability min(1, p(x)/q(x)), after a rejection draw "
                               "from max(0, p - q) normalised, a bonus from p when all stand)";
const char* const kBiasMeasure = "D = sum((p' - p)^2 / p)";
std::string fixed(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}
}  // namespace

CheckDef spec_greedy_def() {
  return {check::kSpecGreedy,
          "greedy speculative decoding is plain greedy decoding, id for id, past the window, and every new id's logits from the "
          "verify step of the drafts and the last id are a one-token step's (our reference) - the main run's own ids replayed as "
          "drafts (replay: always right, every draft accepted, asserted; wrong every p: those at multiples of p moved by one id, "
          "accepted in part with or without a trained draft), the trained draft (model) and prompt lookup (ngram): " +
              runs_text() + "; and our runner-up drafted, under each rule offered, after the prompts of drawn ids whose next id's "
              "top two are closest (the " + std::to_string(kNearTies) + " narrowest margins over twice the bound among " +
              std::to_string(kTieContexts) + " contexts of " + std::to_string(kTieLength) + " ids): rejected each",
          spec_greedy_check, static_cast<Tags>(Tag::PastWindow), Judge::Reference, {Op::Speculate}, Cost::Runs,
          "a verify step without its causal mask or at shifted positions, rejected entries left in the cache, a wrong accepted count, "
          "the bonus id from the wrong position, every draft accepted, a draft kept within a tolerance of the best in greedy decoding"};
}

CheckDef spec_seeded_def() {
  return {check::kSpecSeeded,
          "sample-and-match speculative decoding at a positive temperature with every sampler stage is plain seeded decoding, draw "
          "for draw, past the window (one draw of the target's stream per new id), each id's logits the plain run's - with the plain "
          "run's own ids replayed as drafts (blocks accepted whole) and prompt lookup (most drafts rejected)",
          spec_seeded_check, static_cast<Tags>(Tag::PastWindow), Judge::Tokens, {Op::Speculate}, Cost::Runs,
          "a speculative round that draws from another stream or another distribution than plain decoding, or a verify step whose "
          "logits are not a one-token step's"};
}

CheckDef spec_stops_def() {
  return {check::kSpecStops,
          "a stop id accepted inside a block of " + std::to_string(kStopK) + " drafts ends the output there and a budget of " +
              std::to_string(kBudget) + " ids gives exactly that, plain steps after either going on from exactly the ids emitted; with "
              "a penalty the greedy ids are plain decoding's (the history is the accepted ids)",
          spec_stops_check, 0, Judge::Tokens, {Op::Speculate}, Cost::Runs,
          "ids emitted after a stop or past the budget (left in the cache too), drafted ids counted in the penalty's history"};
}

CheckDef spec_cache_def() {
  return {check::kSpecCache,
          "after speculative rounds of a draft never right (the main run's ids each moved by one: none accepted, asserted) that "
          "each rejected all " + std::to_string(kCacheK) +
              " drafts to past the window, the rounds and " +
              std::to_string(kThenPlain) + " plain steps after them on the same cache are our reference's over the same sequence (the "
              "cache holds exactly the ids emitted, every layer's window restored)",
          spec_cache_check, static_cast<Tags>(Tag::PastWindow), Judge::Reference, {Op::Speculate}, Cost::Run,
          "rejected drafts left in the cache, a rollback that misses a layer (a sliding layer's history) or its window"};
}

CheckDef spec_distribution_def() {
  return {check::kSpecDistribution,
          std::string(kExactRule) + " leaves the target's distribution as it was: the first id, the first two, and the id drawn after "
              "a rejected draft, by chi-square against our uncached model's exact probabilities (an id drawn where that probability is nil "
              "fails it at once) at a false alarm rate of " +
              sci(kFalseAlarm) + " each, the draws sized so a bias " + kBiasMeasure + " of " + fixed(kBias, 2) +
              " at either position is found with " + fixed(kSigmas, 0) + " sigma of power (the test after a rejection runs on the "
              "draws that had one, and states the bias it finds with that power)",
          spec_distribution_check, static_cast<Tags>(Tag::Deep), Judge::Law, {Op::Speculate}, Cost::Runs,
          std::string("an acceptance test other than the exact rule's (every draft accepted, the draft's random stream reused), q or p "
                      "not the distributions after the whole sampler pipeline, a residual other than the rule's or not normalised, a "
                      "penalty over drafted ids")};
}

}  // namespace tinygpt::checks
