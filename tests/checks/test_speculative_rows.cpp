// The speculative rows (checks/src/table/speculative.cpp) and their faults (checks/src/faults/
// speculative.cpp): the production caches pass every row, every planted fault fails each row it names,
// and on the shipped fixture the distribution row runs at the power it states and passes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "small_model.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/checks/diagnose.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/checks/target.h"

#include <nlohmann/json.hpp>

#include "remote_target.h"

namespace tinygpt::checks {
namespace {

// The offer of a test target that forwards to `inner` but neither shows its sampler nor makes a second
// instance of itself (it overrides neither).
Offers forwarded_offers(const DecodeTarget& inner) {
  Offers o = inner.offers();
  o.no_sampler = "the forwarding target shows no sampler";
  o.no_second_instance = "the forwarding target makes no second instance";
  return o;
}


const std::vector<std::string> kSpecRows = {check::kSpecGreedy, check::kSpecSeeded, check::kSpecStops, check::kSpecCache,
                                            check::kSpecDistribution};

// Random weights at the series' scale make greedy runs of one repeated id (nothing to stop at, no
// drafted id the penalty has not seen); sharpened, the runs vary as a trained model's do.
GPT sharp(uint64_t seed) {
  GPT m(small_config(), seed);
  m->eval();
  at::NoGradGuard ng;
  for (const auto& item : m->named_parameters())
    if (item.key().find("norm") == std::string::npos) item.value().mul_(4.0);
  return m;
}

// The target with its weights moved by noise: a draft that agrees with it often, not always.
GPT perturbed(GPT& target, uint64_t seed) {
  GPT d(small_config(), seed);
  d->eval();
  at::NoGradGuard ng;
  auto theirs = target->named_parameters();
  for (auto& item : d->named_parameters()) {
    const at::Tensor t = theirs[item.key()];
    item.value().copy_(t + 0.35 * t.std() * at::randn_like(t));
  }
  return d;
}

class SpeculativeRows : public ::testing::Test {
 protected:
  void SetUp() override {
    at::manual_seed(5);
    draft = perturbed(model, 12);
    opts.prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
    opts.tokens = 80;  // 2.5 windows
    opts.draft = draft;
    // The distribution at 4,000 draws: this random model's flat distributions would need ten times more
    // for the stated power (df over 1,000 in the joint); its false alarm rate is the row's, 1e-6 per test.
    // The fixture's test below runs it at its stated power.
    opts.spec_draws = 4000;
  }
  GPT model = sharp(11);
  GPT draft{nullptr};
  EquivalenceOptions opts;
};

// Both production caches pass every speculative row.
TEST_F(SpeculativeRows, ProductionCachesPassEveryRow) {
  const Reference ref = build_reference(model, opts);
  for (const char* cache : {"rolling", "static"}) {
    ModelTarget target(model, cache_registry().get(cache));
    const auto r = run_checks(model, opts, target, kSpecRows, &ref);
    ASSERT_EQ(r.checks.size(), kSpecRows.size());
    for (const auto& c : r.checks) EXPECT_EQ(c.status, Status::Pass) << cache << " " << c.name << ": " << c.detail;
    const CheckResult& greedy = r.checks[0];
    EXPECT_EQ(greedy.stats.at("acceptance_replay"), 1.0) << "the target's own greedy ids are always right at temperature 0";
    EXPECT_EQ(r.checks[3].stats.at("acceptance_never_right"), 0.0) << "spec-cache's draft is never the argmax";
    EXPECT_GT(greedy.stats.at("acceptance_model"), 0.0);
    EXPECT_LT(greedy.stats.at("acceptance_model"), 1.0);
    const CheckResult& dist = r.checks[4];
    EXPECT_EQ(dist.stats.at("draws"), 4000.0);
    EXPECT_NE(dist.detail.find("after a rejected first draft"), std::string::npos) << dist.detail;
  }
}

// The draft "none" is plain decoding through the speculative loop: greedy, the main run's ids; seeded
// sample-and-match, the production loop's seeded draws id for id (what an engine's "none" answers for it).
TEST_F(SpeculativeRows, NoDraftsArePlainDecoding) {
  ModelTarget target(model, cache_registry().get("rolling"));
  SpeculativeRequest q;
  q.prompt = {1, 2, 3};
  q.n = 40;
  q.draft = "none";
  q.settings.k = 4;
  q.settings.sampling.temperature = 0;
  auto new_ids = [](const Generation& g) {  // seq (1, 3 + n) -> its n new ids
    const at::Tensor t = g.seq[0].slice(0, 3).contiguous();
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  };
  const Generation greedy = target.generate(opts.prompt, q.n, sampler(q.settings.sampling));
  const SpeculativeRun g = target.speculate(q);
  EXPECT_EQ(g.ids, new_ids(greedy));
  EXPECT_EQ(g.drafted, 0);
  EXPECT_EQ(g.rounds, q.n);
  q.settings.rule = AcceptRule::SampleAndMatch;
  q.settings.sampling = SamplingSettings{0.9, 20, 0.9, 1.2};
  q.settings.seed = 7;
  const Generation plain = target.seeded(opts.prompt, q.n, q.settings.sampling, q.settings.seed);
  EXPECT_EQ(target.speculate(q).ids, new_ids(plain));
}

// Every planted fault of a speculative round fails every row it names (the distribution's at fewer
// draws than its stated power: these faults are far over the bias it is sized for).
TEST_F(SpeculativeRows, EveryPlantedFaultFailsItsRows) {
  const Reference ref = build_reference(model, opts);
  int faults = 0;
  for (const CacheVariant* f : cache_registry().all(/*faults=*/true)) {
    if (!f->speculative) continue;
    ++faults;
    ModelTarget target(model, *f);
    const auto r = run_checks(model, opts, target, f->expected, &ref);
    for (const auto& c : r.checks) EXPECT_EQ(c.status, Status::Fail) << f->name << ": " << c.name << " must catch it; " << c.detail;
    // Without a trained draft (a user's own checkpoint), the greedy, stop and cache rows still catch it.
    std::vector<std::string> cheap;
    for (const auto& n : f->expected)
      if (n != check::kSpecDistribution) cheap.push_back(n);
    if (cheap.empty()) continue;
    EquivalenceOptions bare = opts;
    bare.draft = GPT(nullptr);
    ModelTarget again(model, *f);
    for (const auto& c : run_checks(model, bare, again, cheap, &ref).checks)
      EXPECT_EQ(c.status, Status::Fail) << f->name << " without a trained draft: " << c.name << " must catch it; " << c.detail;
  }
  EXPECT_GE(faults, 14);
}

// --diagnose names every planted fault the four cheap rows catch: each fault's failures through
// spec-greedy, spec-seeded, spec-stops and spec-cache match that fault first among the catalogue's, run on
// the same model (the candidates' runs are shared between the faults through TINYGPT_REFERENCE_CACHE
// where it is set, as ctest sets it).
TEST_F(SpeculativeRows, DiagnosisNamesEveryFaultTheCheapRowsCatch) {
  const std::vector<std::string> rows = {check::kSpecGreedy, check::kSpecSeeded, check::kSpecStops, check::kSpecCache};
  const Reference ref = build_reference(model, opts);
  int named = 0;
  for (const CacheVariant* f : cache_registry().all(/*faults=*/true)) {
    if (!f->speculative || std::none_of(f->expected.begin(), f->expected.end(), [&](const std::string& n) {
          return std::find(rows.begin(), rows.end(), n) != rows.end();
        }))
      continue;
    ModelTarget target(model, *f);
    const auto r = run_checks(model, opts, target, rows, &ref);
    const Diagnosis d = diagnose(model, opts, r.checks);
    ASSERT_TRUE(d.ran()) << f->name << " failed no row";
    ASSERT_FALSE(d.matches.empty()) << f->name << ": " << d.text;
    EXPECT_EQ(d.matches.front(), f->name) << d.text;
    ++named;
  }
  EXPECT_GE(named, 10);
}

// The exact rule's negative controls pass every row but the distribution's: greedy decoding, seeded
// sample-and-match and the stops cannot see them.
TEST_F(SpeculativeRows, DistributionFaultsHideFromEveryOtherRow) {
  const Reference ref = build_reference(model, opts);
  for (const char* name : {"spec-acceptance-from-draft-stream", "spec-residual-is-p", "spec-residual-unnormalised", "spec-q-from-raw-logits"}) {
    ModelTarget target(model, cache_registry().get(name));
    const auto r = run_checks(model, opts, target, {check::kSpecGreedy, check::kSpecSeeded, check::kSpecStops, check::kSpecCache}, &ref);
    for (const auto& c : r.checks) EXPECT_EQ(c.status, Status::Pass) << name << ": " << c.name << ": " << c.detail;
  }
}

// An engine that drafts only where the request leaves room for `room` ids or more (llama-server drafts at
// most the ids left less one, so nothing in a request of two): shorter requests are its plain decoding,
// and, as llama-server's, its first id always comes from its step over the prompt, its drafts after it.
class DraftsOnlyWithRoom final : public DecodeTarget {
 public:
  DraftsOnlyWithRoom(DecodeTarget& inner, int64_t room) : inner_(inner), room_(room) {}
  std::string name() const override { return inner_.name(); }
  int64_t context() const override { return inner_.context(); }
  void reset() override { inner_.reset(); }
  at::Tensor prefill(const at::Tensor& ids) override { return inner_.prefill(ids); }
  at::Tensor step(const at::Tensor& ids) override { return inner_.step(ids); }
  Generation generate(const at::Tensor& prompt, int64_t n, const TokenChooser& choose) override {
    return inner_.generate(prompt, n, choose);
  }
  Offers make_offers() const override { return forwarded_offers(inner_); }
  SpeculativeAnswer speculate(const SpeculativeRequest& q) override {
    SpeculativeRequest first = q;
    first.draft = "none";
    if (q.n < room_) return inner_.speculate(first);
    first.n = 1;
    const SpeculativeAnswer head = inner_.speculate(first);
    SpeculativeRequest rest = q;
    rest.prompt.push_back(head.ids.at(0));
    rest.n = q.n - 1;
    rest.settings.seed = q.settings.seed + (1ULL << 40);  // streams of its own (not the first id's)
    SpeculativeAnswer a = inner_.speculate(rest);
    a.ids.insert(a.ids.begin(), head.ids.at(0));
    return a;
  }

 private:
  DecodeTarget& inner_;
  int64_t room_;
};

// Where runs of two ids draft nothing the distribution row judges the first two ids of runs of three, and
// still catches a wrong rule there; a target that drafts in neither is skipped, saying so.
TEST_F(SpeculativeRows, DistributionJudgesRunsOfThreeWhereTwoDraftNothing) {
  opts.spec_draws = 2000;
  const Reference ref = build_reference(model, opts);
  ModelTarget right(model, cache_registry().get("rolling"));
  DraftsOnlyWithRoom three(right, 3);
  const CheckResult pass = run_checks(model, opts, three, {check::kSpecDistribution}, &ref).checks.at(0);
  EXPECT_EQ(pass.status, Status::Pass) << pass.detail;
  EXPECT_NE(pass.detail.find("runs of three ids (none drafted in runs of two)"), std::string::npos) << pass.detail;
  EXPECT_EQ(pass.stats.at("draws"), 2000.0) << "the probe's runs of two are not counted";
  ModelTarget wrong(model, cache_registry().get("spec-residual-is-p"));
  DraftsOnlyWithRoom wrong_three(wrong, 3);
  const CheckResult fail = run_checks(model, opts, wrong_three, {check::kSpecDistribution}, &ref).checks.at(0);
  EXPECT_EQ(fail.status, Status::Fail) << fail.detail;
  EXPECT_NE(fail.detail.find("runs of three ids"), std::string::npos) << fail.detail;
  EXPECT_NE(fail.detail.find("the second id after a rejected draft of it: chi2 inf"), std::string::npos) << fail.detail;
  EXPECT_NE(pass.detail.find("the second id after a rejected draft of it"), std::string::npos) << pass.detail;
  DraftsOnlyWithRoom never(right, 4);
  const CheckResult skipped = run_checks(model, opts, never, {check::kSpecDistribution}, &ref).checks.at(0);
  EXPECT_EQ(skipped.status, Status::Skipped) << skipped.detail;
  EXPECT_NE(skipped.detail.find("20 runs of two ids nor in 2000 of three"), std::string::npos) << skipped.detail;
}

// A target without speculative decoding skips every row, saying why.
TEST_F(SpeculativeRows, TheRowsSkipWhereTheTargetCannotRollBack) {
  CacheVariant ring;
  ring.name = "no-rollback";
  ring.description = "a cache without truncate";
  struct NoTruncate final : KVCache {
    RollingKVCache inner;
    explicit NoTruncate(const Config& c) : inner(c) {}
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override { return inner.update(l, k, v); }
    void reset() override { inner.reset(); }
    int64_t length() const override { return inner.length(); }
    int64_t bytes() const override { return inner.bytes(); }
  };
  ring.make_cache = [](const Config& c) { return std::make_unique<NoTruncate>(c); };
  ModelTarget target(model, ring);
  const auto r = run_checks(model, opts, target, kSpecRows);
  for (const auto& c : r.checks) {
    EXPECT_EQ(c.status, Status::Skipped) << c.name << ": " << c.detail;
    EXPECT_NE(c.detail.find("clone and truncate"), std::string::npos) << c.detail;
  }
}

// On the shipped fixture with its trained draft: the distribution row sizes its draws for 3 sigma of
// power at D = 0.01 at each position (the first id, the first two), tests the two after a rejection too,
// and passes.
TEST(SpeculativeFixture, DistributionRowRunsAtItsStatedPower) {
  Fixture fx = load_fixture(data_dir(), at::kCPU);
  ASSERT_TRUE(fx.draft) << "golden/draft.safetensors is shipped with the fixture";
  EquivalenceOptions o;
  o.prompt = main_prompt();
  o.tokens = 16;
  o.draft = fx.draft;
  // The production path (the static cache, the decode kernels): its verify steps are the cheapest, and
  // the draws are the cost.
  ModelTarget target(fx.model, cache_registry().get("static"));
  const auto r = run_checks(fx.model, o, target, {check::kSpecDistribution});
  const CheckResult& c = r.checks.at(0);
  EXPECT_EQ(c.status, Status::Pass) << c.detail;
  EXPECT_EQ(c.detail.find("no trained draft"), std::string::npos) << c.detail;
  // Three tests, the first two (a position each) with at least 3 sigma of power: "power 3.4 sigma".
  std::cout << c.detail << "\n";
  size_t at = 0;
  int tests = 0;
  while ((at = c.detail.find("power ", at)) != std::string::npos) {
    if (tests < 2) {
      EXPECT_GE(std::stod(c.detail.substr(at + 6)), 3.0) << c.detail;
    }
    ++tests, ++at;
  }
  EXPECT_EQ(tests, 3) << c.detail;
  EXPECT_GT(c.stats.at("acceptance"), 0.1);
  EXPECT_LT(c.stats.at("acceptance"), 0.9);
}

// --- The protocol's 'speculate' (docs/protocol.md): an engine's answer read field by field ---

using nlohmann::json;

constexpr int64_t kV = 8;

json logits_rows(size_t n) { return json(std::vector<std::vector<double>>(n, std::vector<double>(kV, 0.5))); }

SpeculativeRequest asked(int64_t n, std::vector<int64_t> stop = {}, int64_t then = 0) {
  SpeculativeRequest q;
  q.prompt = {1, 2};
  q.n = n;
  q.settings.stop = std::move(stop);
  q.then_plain = then;
  return q;
}

json good_answer() {
  return {{"ok", true},   {"ids", {3, 4, 5}}, {"logits", logits_rows(3)}, {"rounds", 2},
          {"drafted", 4}, {"accepted", 1},    {"accepted_per_round", {1, 0}}};
}

TEST(SpeculateAnswer, AWellFormedAnswerIsReadWithItsCounts) {
  const SpeculativeRun run = answer_speculated(good_answer(), asked(3), kV);
  EXPECT_EQ(run.ids, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(run.logits.sizes(), (at::IntArrayRef{3, kV}));
  EXPECT_EQ(run.rounds, 2);
  EXPECT_EQ(run.drafted, 4);
  EXPECT_EQ(run.accepted, 1);
  EXPECT_EQ(run.accepted_per_round, (std::vector<int64_t>{1, 0}));
  EXPECT_FALSE(run.stopped);
  // A stop id may end the ids early (that id included), and the plain steps after come back too.
  json a = good_answer();
  a["ids"] = {3, 6};
  a["logits"] = logits_rows(2);
  a["then_ids"] = {7};
  a["then_logits"] = logits_rows(1);
  const SpeculativeRun stopped = answer_speculated(a, asked(3, {6}, 1), kV);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.then_ids, (std::vector<int64_t>{7}));
  EXPECT_EQ(stopped.then_logits.size(0), 1);
}

TEST(SpeculateAnswer, EveryMalformedFieldIsTheEngineBeingWrong) {
  struct Case {
    const char* what;
    std::function<void(json&)> spoil;
    SpeculativeRequest q;
  };
  const std::vector<Case> cases = {
      {"two ids for n = 3 and no stop", [](json& a) { a["ids"] = {3, 4}; a["logits"] = logits_rows(2); }, asked(3)},
      {"an id outside the vocabulary", [](json& a) { a["ids"][1] = kV; }, asked(3)},
      {"logits for fewer ids", [](json& a) { a["logits"] = logits_rows(2); }, asked(3)},
      {"a logit that is not a number", [](json& a) { a["logits"][0][0] = "x"; }, asked(3)},
      {"more accepted than drafted", [](json& a) { a["accepted"] = 5; }, asked(3)},
      {"rounds whose counts do not sum to accepted", [](json& a) { a["accepted_per_round"] = {0, 0}; }, asked(3)},
      {"a count per round for another number of rounds", [](json& a) { a["accepted_per_round"] = {1}; }, asked(3)},
      {"no counts", [](json& a) { a.erase("drafted"); }, asked(3)},
      {"plain steps asked for and not answered", [](json&) {}, asked(3, {}, 2)},
      {"more ids than n", [](json& a) { a["ids"] = {3, 4, 5, 6}; a["logits"] = logits_rows(4); }, asked(3, {9})},
  };
  for (const Case& c : cases) {
    json a = good_answer();
    c.spoil(a);
    EXPECT_THROW(answer_speculated(a, c.q, kV), WrongAnswer) << c.what;
  }
}

TEST(SpeculateHello, ASpeculateCapabilityItCannotReadRefusesTheEngine) {
  const json fine = {{"ok", true}, {"name", "e"}, {"protocol", 3}, {"speculate", {{"drafts", {"ngram", "none"}}, {"rules", {"exact"}}}}};
  EXPECT_NO_THROW(check_hello(fine));
  for (const json& bad : {json{{"speculate", {"ngram"}}}, json{{"speculate", {{"drafts", {"ngram"}}}}},
                          json{{"speculate", {{"drafts", {"eagle"}}, {"rules", {"exact"}}}}},
                          json{{"speculate", {{"drafts", {"ngram"}}, {"rules", {"typical"}}}}}}) {
    json h = fine;
    h["speculate"] = bad["speculate"];
    EXPECT_THROW(check_hello(h), EngineUnusable) << bad.dump();
  }
}

}  // namespace
}  // namespace tinygpt::checks
