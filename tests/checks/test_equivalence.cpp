// The equivalence harness and the fault matrix: the correct caches pass every check, every fault
// is caught by the checks it names, and a cache wrong at ONE step is named at that step.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/conform.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/checks/deviations.h"
#include "tinygpt/checks/inject.h"
#include "tinygpt/checks/parallel_runs.h"
#include "tinygpt/tools/html_report.h"
#include "tinygpt/checks/report.h"
#include "tinygpt/checks/verify.h"
#include "tinygpt/ring_kv_cache.h"
#include "rows.h"
#include "small_model.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <stdexcept>

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


// A small model keeps the full fault matrix fast; its context is short so 2.5 windows are cheap.
EquivalenceOptions options(const at::Tensor& prompt, int64_t tokens) {
  EquivalenceOptions o;
  o.prompt = prompt;
  o.tokens = tokens;
  return o;
}

class Harness : public ::testing::Test {
 protected:
  void SetUp() override { model->eval(); }
  GPT model{small_config(), 11};
  EquivalenceOptions opts = options(at::tensor({1, 2, 3}, at::kLong).unsqueeze(0), 80);
};

// The default set, as the table derives it.
const std::vector<std::string> kChecks = model_checks_with(static_cast<Tags>(Tag::Default));

class EveryProductionCache : public Harness, public ::testing::WithParamInterface<std::string> {};

TEST_P(EveryProductionCache, PassesEveryCheck) {
  const auto ref = build_reference(model, opts);
  const auto r = check_equivalence(model, opts, ref, cache_registry().get(GetParam()));
  EXPECT_TRUE(r.passed()) << format_equivalence(r);
  ASSERT_EQ(r.checks.size(), kChecks.size());
  for (size_t i = 0; i < kChecks.size(); ++i) EXPECT_EQ(r.checks[i].name, kChecks[i]);
  EXPECT_EQ(r.must_match, 29);
  EXPECT_GE(r.identical_prefix, 29);
  EXPECT_LT(r.loop_full.worst, 1e-5);
  EXPECT_LT(r.loop_band.worst, 1e-5);
  EXPECT_EQ(r.loop_band.diffs.size(), 80u);
  EXPECT_NE(format_equivalence(r).find("first 29 tokens identical with and without the cache"), std::string::npos);
}
INSTANTIATE_TEST_SUITE_P(Caches, EveryProductionCache, ::testing::Values("rolling", "static"));

// The faults of a speculative round need a model whose greedy runs vary (a stop id to find, drafted ids
// the penalty has not seen): test_speculative_rows.cpp holds them to their rows on one.
std::vector<const CacheVariant*> faults_but_speculative() {
  std::vector<const CacheVariant*> out;
  for (const CacheVariant* f : cache_registry().all(/*faults=*/true))
    if (!f->speculative) out.push_back(f);
  return out;
}

TEST_F(Harness, EveryFaultIsCaughtByTheChecksItNamesAndTheControlsPass) {
  const auto faults = faults_but_speculative();
  ASSERT_GE(faults.size(), 18u);
  InjectionOptions io;
  io.drift_tokens = 40;
  const auto rep = run_injection(model, opts, faults, io);
  ASSERT_EQ(rep.controls.size(), cache_registry().all(false).size());
  for (const auto& c : rep.controls) EXPECT_TRUE(c.passed()) << format_equivalence(c);
  for (const auto& f : rep.faults) {
    EXPECT_TRUE(f.caught()) << f.fault << " was missed by every check";
    EXPECT_TRUE(f.missed_expected().empty()) << f.fault << " missed by " << f.missed_expected().front();
  }
  EXPECT_TRUE(rep.passed()) << format_injection(rep);
}

// verify's shortened fault runs (past the window by 16; 8 steps for the side and serving checks
// here, 48 in verify) still catch every fault by the checks it names, and the serving checks run
// the steps they were given.
TEST_F(Harness, EveryFaultIsCaughtByShortenedFaultRuns) {
  const auto faults = faults_but_speculative();
  InjectionOptions io;
  io.drift_tokens = 40;
  io.fault_tokens = model->config().context + 16;
  io.fault_side_tokens = 8;
  io.control_checks = {"tokens", "ragged"};
  const auto rep = run_injection(model, opts, faults, io);
  for (const auto& f : rep.faults) {
    EXPECT_TRUE(f.caught()) << f.fault << " was missed by every check";
    EXPECT_TRUE(f.missed_expected().empty()) << f.fault << " missed by " << f.missed_expected().front();
    for (const auto& k : f.checks)
      if (k.name == "ragged" && k.status == Status::Pass) {
        EXPECT_NE(k.detail.find("in one batch, 8 steps"), std::string::npos) << f.fault << ": " << k.detail;
      }
  }
  // The controls keep the full run: the shortest row 16 past the window.
  const std::string full = "in one batch, " + std::to_string(model->config().context - 3 + 16) + " steps";
  for (const auto& c : rep.controls) {
    ASSERT_EQ(c.checks.size(), 2u);
    EXPECT_NE(c.checks[1].detail.find(full), std::string::npos) << c.cache << ": " << c.checks[1].detail;
  }
}

// The runs of the matrix side by side give what they give one at a time: every verdict, detail,
// drift and per-step difference, with the controls, for a fault of each family. One worker on
// one intra-op thread is the reference; two workers get one thread each, as verify runs them.
TEST_F(Harness, FaultMatrixRunsSideBySideGiveWhatTheyGiveOneAtATime) {
  std::vector<const CacheVariant*> faults;
  for (const char* n : {"rope-offset", "never-trimmed", "loop-no-reset", "loop-history-no-prompt", "rows-mixed"})
    faults.push_back(&cache_registry().get(n));
  InjectionOptions io;
  io.drift_tokens = 40;
  io.fault_tokens = 60;
  const int threads = at::get_num_threads();
  auto lines = [](const InjectionReport& rep) {
    std::vector<std::string> out;
    for (const auto& c : rep.controls)
      for (const auto& k : c.checks) out.push_back(c.cache + " " + k.name + " " + to_string(k.status) + " " + k.detail);
    for (const auto& f : rep.faults) {
      for (const auto& k : f.checks) out.push_back(f.fault + " " + k.name + " " + to_string(k.status) + " " + k.detail);
      out.push_back(f.fault + " drift " + (f.drift_after ? std::to_string(*f.drift_after) : "none"));
      for (double d : f.step_diffs) out.push_back(f.fault + " step " + std::to_string(d));
    }
    return out;
  };
  // One reference for both: it is built on the calling thread, and its last bits follow that
  // thread's intra-op count, which is not what this test is about.
  const Reference ref = build_reference(model, opts);
  io.reference = &ref;
  at::set_num_threads(1);
  io.workers = 1;
  const auto alone = run_injection(model, opts, faults, io);
  at::set_num_threads(2);
  io.workers = 2;
  const auto together = run_injection(model, opts, faults, io);
  EXPECT_EQ(at::get_num_threads(), 2) << "the caller's intra-op threads come back";
  at::set_num_threads(threads);
  ASSERT_EQ(together.faults.size(), faults.size());
  for (size_t i = 0; i < faults.size(); ++i) EXPECT_EQ(together.faults[i].fault, faults[i]->name) << "order kept";
  EXPECT_EQ(lines(together), lines(alone));
  // Not a constant: the faults differ from each other and are caught.
  EXPECT_EQ(alone.caught(), static_cast<int>(faults.size()));
  EXPECT_NE(lines(alone)[0], lines(alone)[lines(alone).size() / 2]);
}

// The reference's uncached steps run side by side from a guess of the sequence: the same reference as
// one step after another, with a right guess and with a guess that parts from the run at step 40
// (from there it continues one step after another) - the guess changes the time, never the result.
TEST_F(Harness, AReferenceFromAGuessIsTheUncachedLoopsOwn) {
  const Reference plain = build_reference(model, opts.prompt, opts.tokens);
  at::Tensor wrong = plain.uncached.clone();
  wrong[0][3 + 40] = (wrong[0][3 + 40].item<int64_t>() + 1) % model->config().vocab_size;
  for (const at::Tensor& guess : {plain.uncached, wrong}) {
    const Reference r = build_reference(model, opts.prompt, opts.tokens, guess, 2);
    EXPECT_TRUE(r.uncached.equal(plain.uncached));
    EXPECT_LT((r.uncached_logits - plain.uncached_logits).abs().max().item<double>(), 1e-6);
    EXPECT_EQ(r.uncached_logits.sizes(), plain.uncached_logits.sizes());
    EXPECT_TRUE(r.uncached_margin.allclose(plain.uncached_margin));
    EXPECT_TRUE(r.steps.band.equal(plain.steps.band));
  }
}

TEST(ParallelRuns, EveryJobRunsOnceAndTheFirstErrorComesBack) {
  const int threads = at::get_num_threads();
  std::vector<std::atomic<int>> runs(40);
  run_in_parallel(runs.size(), 3, [&](size_t i) { ++runs[i]; });
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), 1) << i;
  std::atomic<int> started{0};
  EXPECT_THROW(run_in_parallel(40, 2, [&](size_t i) {
                 ++started;
                 if (i == 3) throw std::runtime_error("job 3");
                 if (i > 3) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // 36 of them: 0.7 s
               }),
               std::runtime_error);
  EXPECT_LT(started.load(), 40) << "after an error the workers take no new jobs";
  EXPECT_EQ(at::get_num_threads(), threads);
  EXPECT_THROW(run_in_parallel(3, 0, [](size_t) {}), std::invalid_argument);
}

// Which check catches what is the point of the matrix: these must stay exactly so.
TEST_F(Harness, EachFaultFamilyIsCaughtWhereItActs) {
  std::vector<const CacheVariant*> faults;
  for (const char* n : {"never-trimmed", "trim-before-attend", "loop-wrapped-positions", "loop-clamped-positions",
                        "loop-prefill-offset", "loop-no-reset", "loop-history-no-prompt", "rows-mixed",
                        "prefill-rows-shifted", "loop-pos-off-by-one"})
    faults.push_back(&cache_registry().get(n));
  InjectionOptions io;
  io.drift_tokens = 40;
  io.fault_tokens = 60;  // a prefix of the reference, still past the 32-token window
  io.controls = {&cache_registry().get("static")};
  const auto rep = run_injection(model, opts, faults, io);
  EXPECT_TRUE(rep.controls_passed());
  auto outcome = [&](const std::string& n) -> const FaultOutcome& {
    for (const auto& f : rep.faults)
      if (f.fault == n) return f;
    throw std::logic_error(n);
  };
  // Past-window faults: invisible inside the window, caught by the banded reference.
  for (const char* n : {"never-trimmed", "trim-before-attend", "loop-wrapped-positions", "loop-clamped-positions"}) {
    EXPECT_FALSE(outcome(n).caught_by("logits")) << n << " should be invisible inside the window";
    EXPECT_TRUE(outcome(n).caught_by("window-reference")) << n;
  }
  // Loop faults are invisible to the harness's own loop: that is why the production loop is checked.
  for (const char* n : {"loop-wrapped-positions", "loop-clamped-positions", "loop-prefill-offset", "loop-no-reset",
                        "loop-history-no-prompt", "loop-pos-off-by-one"})
    EXPECT_FALSE(outcome(n).caught_by("teacher-forced")) << n;
  EXPECT_TRUE(outcome("loop-pos-off-by-one").caught_by("logits"));
  // A long prompt is the only place the prefill offset shows; reset, sampling and batches likewise.
  EXPECT_EQ(outcome("loop-prefill-offset").checks.size(), kChecks.size());
  for (const auto& c : outcome("loop-prefill-offset").checks) EXPECT_EQ(c.ok(), c.name != "long-prompt") << c.name;
  for (const auto& c : outcome("loop-history-no-prompt").checks) EXPECT_EQ(c.ok(), c.name != "sampled") << c.name;
  for (const char* n : {"rows-mixed", "prefill-rows-shifted"})
    for (const auto& c : outcome(n).checks) EXPECT_EQ(c.ok(), c.name != "batch") << n << ": " << c.name;
  // Every cell of the matrix is a verdict: no check erred on any of these faults.
  for (const auto& f : rep.faults) EXPECT_TRUE(f.errors().empty()) << f.fault << ": " << f.errors().front();
  EXPECT_TRUE(outcome("loop-no-reset").caught_by("reset"));
  EXPECT_FALSE(outcome("loop-no-reset").caught_by("tokens"));
}

// A cache that is wrong at exactly one decode step: on the step that brings it to `bad_len`
// entries, the LAST layer's newest value comes back scaled. Only the last layer, so no stored
// entry is affected and every other step stays exact.
class OneBadStep final : public KVCache {
 public:
  OneBadStep(const Config& c, int64_t bad_len) : inner_(c), last_layer_(c.n_layers - 1), bad_len_(bad_len) {}
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override {
    auto kv = inner_.update(layer, k, v);
    if (layer == last_layer_ && kv.second.size(2) == bad_len_ && k.size(2) == 1) {
      at::Tensor V = kv.second.clone();
      V.narrow(2, bad_len_ - 1, 1).mul_(50.0);
      return {kv.first, V};
    }
    return kv;
  }
  void reset() override { inner_.reset(); }
  int64_t length() const override { return inner_.length(); }
  int64_t bytes() const override { return inner_.bytes(); }

 private:
  RollingKVCache inner_;
  int64_t last_layer_, bad_len_;
};

TEST_F(Harness, ACacheWrongAtOneStepIsNamedAtThatStep) {
  const int64_t bad_len = 11;  // the step feeding position 10
  CacheVariant bad;
  bad.name = "one-bad-step";
  bad.make_cache = [bad_len](const Config& c) { return std::make_unique<OneBadStep>(c, bad_len); };
  const auto ref = build_reference(model, opts);
  const auto r = check_equivalence(model, opts, ref, bad);
  EXPECT_FALSE(r.passed());
  ASSERT_TRUE(r.loop_full.first_position_over.has_value());
  EXPECT_EQ(*r.loop_full.first_position_over, bad_len - 1);
  // Every other in-window step stays within tolerance: the harness localises the fault.
  for (size_t i = 0; i < r.loop_full.diffs.size(); ++i)
    if (static_cast<int64_t>(i) + r.prompt_len - 1 != bad_len - 1) {
      EXPECT_LT(r.loop_full.diffs[i], r.tolerance) << i;
    }
  const std::string text = format_equivalence(r);
  EXPECT_NE(text.find("FAIL logits: production loop vs full forward, inside the window: first over 1.00e-04 at position 10 (step 8, |diff| "),
            std::string::npos) << text;
  EXPECT_NE(text.find("top-2 margin there"), std::string::npos) << text;
  ASSERT_EQ(r.step_margins.size(), 80u);
  EXPECT_GE(r.step_margins[8], 0.0);
}

TEST_F(Harness, JsonReportCarriesTheVerdictAndTheFigures) {
  const auto ref = build_reference(model, opts);
  const auto j = to_json(check_equivalence(model, opts, ref, cache_registry().get("topleft-mask")));
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["cache"], "topleft-mask");
  EXPECT_GT(j["logits"]["worst_diff"].get<double>(), 1e-3);
  EXPECT_EQ(j["checks"].size(), kChecks.size());
  EXPECT_EQ(j["window_reference"]["per_step_diff"].size(), 80u);
}

// SPEC 4 feeds the last `context` tokens of a longer prompt; the references follow it.
TEST_F(Harness, APromptLongerThanTheContextIsCheckedFromItsLastWindow) {
  EquivalenceOptions long_prompt = options(at::arange(1, 41, at::kLong).unsqueeze(0), 20);
  const auto ref = build_reference(model, long_prompt);
  const auto r = check_equivalence(model, long_prompt, ref, cache_registry().get("static"));
  EXPECT_TRUE(r.passed()) << format_equivalence(r);
  EXPECT_EQ(r.must_match, 0);
  EXPECT_EQ(r.loop_full.diffs.size(), 1u) << "only the prefill's step is inside the window";
}

TEST_F(Harness, RejectsBadOptions) {
  EquivalenceOptions o = opts;
  o.tokens = 0;
  EXPECT_THROW(build_reference(model, o), std::invalid_argument);
  o = opts;
  o.sampling.temperature = 0;
  EXPECT_THROW(build_reference(model, o), std::invalid_argument);
}

// No hidden shared state inside a process: four threads, each with its own model (other weights)
// running every check on a production cache and on a fault, give what each gives alone, to the
// bit (tokens, every check's verdict and figures). The sampled check draws from its own seeded
// generator, never LibTorch's global one, which is what makes this hold.
TEST(Concurrency, ThreadsRunningChecksOnTheirOwnModelsGiveWhatEachGivesAlone) {
  struct Outcome {
    at::Tensor produced;
    std::vector<std::string> lines;
  };
  auto run = [](uint64_t seed, const std::string& cache) {
    GPT model{small_config(), seed};
    model->eval();
    EquivalenceOptions o = options(at::tensor({1, 2, 3}, at::kLong).unsqueeze(0), 60);
    const auto ref = build_reference(model, o);
    const auto r = check_equivalence(model, o, ref, cache_registry().get(cache));
    Outcome out{r.produced, {}};
    for (const auto& c : r.checks) out.lines.push_back(c.name + " " + to_string(c.status) + " " + c.detail);
    return out;
  };
  const std::vector<std::pair<uint64_t, std::string>> jobs = {{21, "static"}, {22, "rolling"}, {23, "rope-offset"}, {24, "rows-mixed"}};
  std::vector<Outcome> alone, together(jobs.size());
  for (const auto& [seed, cache] : jobs) alone.push_back(run(seed, cache));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        together[i] = run(jobs[i].first, jobs[i].second);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(jobs[i].second);
    ASSERT_EQ(errors[i], "");
    EXPECT_TRUE(together[i].produced.equal(alone[i].produced));
    EXPECT_EQ(together[i].lines, alone[i].lines);
  }
  // The jobs differ from each other (other weights, a fault): equal results are not a constant.
  EXPECT_NE(alone[0].lines, alone[1].lines);
  EXPECT_NE(alone[2].lines, alone[0].lines);
}

// A planted "fault" that computes exactly what the production path computes: on this model it cannot
// show, so the matrix neither fails nor passes it, says so with the reason the fault names, and marks
// its cells n/o - where a fault with an effect no row catches still fails (below).
TEST_F(Harness, AFaultTheModelCannotShowIsNotObservableNeitherFailNorPass) {
  CacheVariant v = cache_registry().get("rolling");
  v.name = "planted-inert";
  v.description = "the production path under another name";
  v.is_fault = true;
  v.expected = {"logits", "window-reference"};
  v.checks = {"tokens", "logits", "window-reference", "teacher-forced"};
  v.inert_on = [](const GPT&) { return std::string("planted: the same arithmetic"); };
  InjectionOptions io;
  io.fault_tokens = 40;
  io.controls = {&cache_registry().get("rolling")};
  const auto rep = run_injection(model, opts, {&v}, io);
  ASSERT_EQ(rep.faults.size(), 1u);
  const FaultOutcome& f = rep.faults[0];
  EXPECT_FALSE(f.caught());
  EXPECT_FALSE(f.observable) << "effect " << f.effect << ", noise " << f.noise;
  EXPECT_TRUE(f.effect_measured);
  EXPECT_LE(f.effect, kInertMargin * f.noise);
  EXPECT_EQ(f.inert_why, "planted: the same arithmetic");
  EXPECT_EQ(rep.observable(), 0);
  EXPECT_TRUE(rep.faults_passed()) << "a fault the model cannot show does not fail the matrix";
  const std::string text = format_injection(rep);
  EXPECT_NE(text.find("planted-inert: not observable on this model (largest effect"), std::string::npos) << text;
  EXPECT_NE(text.find("planted: the same arithmetic"), std::string::npos) << text;
  EXPECT_NE(text.find("mutation score: 0/0 faults caught (the observable ones; 1 of 1 not observable on this model)"), std::string::npos) << text;
  const FaultMatrix m = fault_matrix(rep);
  for (size_t k = 0; k < m.checks.size(); ++k)
    if (f.ran(m.checks[k])) EXPECT_EQ(cell_symbol(m.cells[0][k]), "n/o") << m.checks[k];
  const nlohmann::json j = to_json(rep);
  EXPECT_EQ(j["faults"][0]["observable"], false);
  EXPECT_EQ(j["faults"][0]["not_observable_why"], "planted: the same arithmetic");
  EXPECT_TRUE(j["faults"][0]["effect"].is_number());
}

// Where the row that must catch a fault was skipped (here: window-reference, inside the window), nothing
// saw the fault either way: it is not measured, and the matrix fails it as before.
TEST_F(Harness, AFaultWhoseRowWasSkippedIsNotExcused) {
  CacheVariant v = cache_registry().get("rolling");
  v.name = "planted-inert-unseen";
  v.description = "the production path under another name, its row skipped";
  v.is_fault = true;
  v.expected = {"window-reference"};
  v.checks = {"tokens", "logits", "window-reference"};
  v.inert_on = [](const GPT&) { return std::string("planted: the same arithmetic"); };
  EquivalenceOptions inside = opts;
  inside.tokens = 24;  // inside the 32-token window
  inside.past_window = false;
  InjectionOptions io;
  io.controls = {&cache_registry().get("rolling")};
  const auto rep = run_injection(model, inside, {&v}, io);
  ASSERT_EQ(rep.faults.size(), 1u);
  const FaultOutcome& f = rep.faults[0];
  EXPECT_FALSE(f.ran("window-reference"));
  EXPECT_TRUE(f.observable);
  EXPECT_FALSE(f.effect_measured);
  EXPECT_FALSE(rep.faults_passed());
}

// A rolling cache whose update a planted cache below changes; the rest is the rolling cache's.
class RollingWithUpdate : public KVCache {
 public:
  explicit RollingWithUpdate(const Config& c) : inner_(c) {}
  void reset() override { inner_.reset(); }
  int64_t length() const override { return inner_.length(); }
  int64_t bytes() const override { return inner_.bytes(); }

 protected:
  RollingKVCache inner_;
};

// Values scaled by 1.01 on their way to the attention: a real effect, far under a loose bound.
class ScaledValues final : public RollingWithUpdate {
 public:
  using RollingWithUpdate::RollingWithUpdate;
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override {
    auto [K, V] = inner_.update(layer, k, v);
    return {K, V * 1.01};
  }
};

// A fault with an effect that no row catches (here under a bound of 0.5) is observable and still fails
// the matrix; a reason it names does not excuse it where the effect is measured.
TEST_F(Harness, AFaultWithAnEffectNoRowCatchesStillFails) {
  CacheVariant v;
  v.name = "planted-scaled-values";
  v.description = "every value scaled by 1.01";
  v.make_cache = [](const Config& c) { return std::make_unique<ScaledValues>(c); };
  v.is_fault = true;
  v.expected = {"logits"};
  v.checks = {"logits", "window-reference"};
  v.inert_on = [](const GPT&) { return std::string("planted: a reason that does not hold"); };
  EquivalenceOptions loose = opts;
  loose.tolerance.logits = loose.tolerance.self = 0.5;
  loose.tolerance.why = "a bound no small effect reaches";
  InjectionOptions io;
  io.fault_tokens = 40;
  io.controls = {&cache_registry().get("rolling")};
  const auto rep = run_injection(model, loose, {&v}, io);
  ASSERT_EQ(rep.faults.size(), 1u);
  const FaultOutcome& f = rep.faults[0];
  EXPECT_FALSE(f.caught()) << "under a bound of 0.5 (worst " << f.worst_logit_diff << ")";
  EXPECT_TRUE(f.observable) << "effect " << f.effect << ", noise " << f.noise;
  EXPECT_GT(f.effect, kInertMargin * f.noise);
  EXPECT_FALSE(rep.faults_passed());
  EXPECT_EQ(format_injection(rep).find("not observable"), std::string::npos);
}

// A cache that throws on its first decode step: the fault "crashes the run".
class ThrowsOnDecode final : public RollingWithUpdate {
 public:
  using RollingWithUpdate::RollingWithUpdate;
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override {
    if (k.size(2) == 1) throw std::runtime_error("planted: this cache cannot decode");
    return inner_.update(layer, k, v);
  }
};

// A fault whose variant throws is an error in every check it reaches, never a detection: the
// matrix fails it as missed, and says the checks erred.
TEST_F(Harness, AFaultThatThrowsIsAnErrorNotACatch) {
  CacheVariant v;
  v.name = "planted-throws";
  v.description = "throws on the first decode step";
  v.make_cache = [](const Config& c) { return std::make_unique<ThrowsOnDecode>(c); };
  v.is_fault = true;
  v.expected = {"logits"};
  InjectionOptions io;
  io.drift_tokens = 20;
  io.fault_tokens = 40;
  io.controls = {&cache_registry().get("rolling")};
  const auto rep = run_injection(model, opts, {&v}, io);
  ASSERT_EQ(rep.faults.size(), 1u);
  const FaultOutcome& f = rep.faults[0];
  EXPECT_FALSE(f.caught()) << "an exception is not a detection";
  EXPECT_FALSE(f.caught_by("logits"));
  EXPECT_EQ(f.missed_expected(), std::vector<std::string>{"logits"});
  EXPECT_FALSE(rep.faults_passed());
  EXPECT_EQ(f.errors().size(), f.checks.size()) << "every check reached the throwing decode step";
  for (const auto& c : f.checks) {
    EXPECT_EQ(c.status, Status::Error) << c.name;
    EXPECT_NE(c.detail.find("error: "), std::string::npos) << c.name << ": " << c.detail;
  }
  EXPECT_NE(f.checks[0].detail.find("planted: this cache cannot decode"), std::string::npos) << f.checks[0].detail;
  EXPECT_NE(f.checks[1].detail.find("see tokens"), std::string::npos) << "later checks name the run that failed: " << f.checks[1].detail;
  const std::string text = format_injection(rep);
  EXPECT_NE(text.find("ERROR"), std::string::npos) << text;
  EXPECT_NE(text.find("errors are not detections"), std::string::npos) << text;
  // The JSON says it as well.
  const auto j = to_json(rep);
  EXPECT_FALSE(j["faults"][0]["caught"].get<bool>());
  EXPECT_EQ(j["faults"][0]["errors"].size(), f.checks.size());
}

// self's default steps: all of the first 16, every 16th, the 8 more of smallest margin, the last; an
// explicit stride keeps every stride-th and the last.
TEST(SelfSteps, TheFirstStepsEverySixteenthTheTightestAndTheLast) {
  const int64_t inside = 254;
  at::Tensor margins = at::linspace(1.0, 2.0, inside, at::kFloat);  // (inside)
  // Ten near-ties: step 5 is among the first 16 anyway, so the 8 more are the next eight; 21, the
  // loosest of them, is left out.
  const std::vector<int64_t> tight = {5, 100, 101, 203, 250, 17, 18, 19, 20, 21};
  for (size_t k = 0; k < tight.size(); ++k) margins[tight[k]] = 0.001f * static_cast<float>(k);
  const SelfSteps s = self_steps(inside, 0, margins);
  std::set<int64_t> got(s.steps.begin(), s.steps.end());
  ASSERT_EQ(got.size(), s.steps.size());
  for (int64_t i = 1; i <= kSelfFirstSteps; ++i) EXPECT_EQ(got.count(i), 1u) << i;
  for (int64_t i = kSelfSpread; i < inside; i += kSelfSpread) EXPECT_EQ(got.count(i), 1u) << i;
  for (int64_t i : {100, 101, 203, 250, 17, 18, 19, 20}) EXPECT_EQ(got.count(i), 1u) << "a tight step: " << i;
  EXPECT_EQ(got.count(21), 0u) << "the ninth tightest outside the first steps";
  EXPECT_EQ(got.count(inside - 1), 1u);
  EXPECT_EQ(*got.begin(), 1);
  EXPECT_EQ(s.steps.size(), static_cast<size_t>(kSelfFirstSteps + (inside - 1) / kSelfSpread - 1 + kSelfTightest + 1));
  EXPECT_EQ(self_steps(inside, 1, margins).steps.size(), static_cast<size_t>(inside - 1));
  const auto every8 = self_steps(inside, 8, margins).steps;
  EXPECT_EQ(every8.front(), 1);
  EXPECT_EQ(every8[1], 9);
  EXPECT_EQ(every8.back(), inside - 1);
  EXPECT_EQ(self_steps(3, 0, at::ones({3})).steps, (std::vector<int64_t>{1, 2}));
}

// self's default steps catch every fault that self at every step catches: on a model with the
// fixture's window, each registered fault through self at stride 1 and at the default choice.
TEST(SelfSteps, TheDefaultChoiceCatchesWhatEveryStepCatches) {
  Config c = small_config();
  c.d_model = 32;
  c.n_heads = 2;
  c.n_layers = 1;
  c.context = 256;
  GPT m(c, 5);
  m->eval();
  EquivalenceOptions every = options(at::tensor({1, 2, 3}, at::kLong).unsqueeze(0), 253);
  every.self_stride = 1;
  EquivalenceOptions chosen = every;
  chosen.self_stride = 0;
  int caught = 0;
  for (const auto* v : cache_registry().all(/*faults=*/true)) {
    ModelTarget a(m, *v), b(m, *v);
    const auto all = run_checks(m, every, a, {check::kSelf}).checks[0];
    const auto some = run_checks(m, chosen, b, {check::kSelf}).checks[0];
    EXPECT_EQ(some.status, all.status) << v->name << ": every step: " << all.detail << "; default steps: " << some.detail;
    caught += all.failed();
  }
  EXPECT_GE(caught, 4) << "self at every step catches the cache faults";
}

// The self check (a target against its own prefill) passes the correct caches and fails cache and
// positioning bugs: the seed's check done inside the target.
TEST_F(Harness, SelfPassesTheCachesAndFailsCacheBugs) {
  EquivalenceOptions o = opts;
  o.tokens = 40;
  o.self_stride = 3;
  for (const char* name : {"rolling", "static"}) {
    ModelTarget t(model, cache_registry().get(name));
    const auto r = run_checks(model, o, t, {"self"});
    ASSERT_EQ(r.checks.size(), 1u);
    EXPECT_EQ(r.checks[0].status, Status::Pass) << name << ": " << r.checks[0].detail;
    EXPECT_LT(*r.checks[0].figure, 1e-5) << name;
  }
  for (const char* name : {"rope-offset", "topleft-mask", "decode-pos-off-by-one", "stale-cache"}) {
    ModelTarget t(model, cache_registry().get(name));
    const auto r = run_checks(model, o, t, {"self"});
    EXPECT_EQ(r.checks[0].status, Status::Fail) << name << ": " << r.checks[0].detail;
    EXPECT_NE(r.checks[0].detail.find("own prefill"), std::string::npos) << r.checks[0].detail;
  }
  // A bug both paths share (keys and values swapped in the prefill too) is consistent with itself:
  // self passes it, and the reference checks fail it. Self judges the cache, never the model.
  ModelTarget swapped(model, cache_registry().get("kv-swapped"));
  const auto r = run_checks(model, o, swapped, {"self", "logits"});
  EXPECT_EQ(r.checks[0].status, Status::Pass) << r.checks[0].detail;
  EXPECT_EQ(r.checks[1].status, Status::Fail) << r.checks[1].detail;
}

// Every reference comparison carries its precision statistics, and --max-kl judges by them: a fault
// whose logits move by ~0.5 fails at 1e-4 and passes a generous KL bound, saying which bound judged it.
TEST_F(Harness, PrecisionStatisticsAreReportedAndCanJudge) {
  ModelTarget clean(model, cache_registry().get("static"));
  const auto ok = run_checks(model, opts, clean, {"logits"});
  const CheckResult& row = ok.checks[0];
  EXPECT_EQ(row.status, Status::Pass);
  for (const char* k : {"max_abs_diff", "top1_agreement", "kl_mean", "kl_max"}) EXPECT_TRUE(row.stats.count(k)) << k;
  EXPECT_EQ(row.stats.at("top1_agreement"), 1.0);
  EXPECT_LT(row.stats.at("kl_max"), 1e-9);
  EXPECT_EQ(row.bound, "max |diff| <= 1.00e-04");

  ModelTarget off(model, cache_registry().get("decode-pos-off-by-one"));
  const auto strict = run_checks(model, opts, off, {"logits"});
  EXPECT_EQ(strict.checks[0].status, Status::Fail);
  const double kl = strict.checks[0].stats.at("kl_mean");
  EXPECT_GT(kl, 0.0);
  EquivalenceOptions lenient = opts;
  lenient.tolerance.max_kl = kl * 2;
  ModelTarget off2(model, cache_registry().get("decode-pos-off-by-one"));
  const auto judged = run_checks(model, lenient, off2, {"logits"});
  EXPECT_EQ(judged.checks[0].status, Status::Pass) << judged.checks[0].detail;
  EXPECT_EQ(judged.checks[0].bound, "mean KL <= " + sci(kl * 2));
  lenient.tolerance.max_kl = kl / 2;
  ModelTarget off3(model, cache_registry().get("decode-pos-off-by-one"));
  EXPECT_EQ(run_checks(model, lenient, off3, {"logits"}).checks[0].status, Status::Fail);
}

// flip_kl is the least KL(P || Q) over every Q whose top two are level: no Q drawn at random with
// q1 = q2 costs less, and the one that moves mass between the top two alone costs exactly that.
TEST(FlipKl, IsTheLeastKlThatLevelsTheTopTwo) {
  at::manual_seed(5);
  for (int trial = 0; trial < 20; ++trial) {
    const at::Tensor logits = at::randn({1, 6}, at::kDouble) * 2;  // (1, V)
    const double f = flip_kl(logits);
    const at::Tensor p = logits.softmax(-1)[0];
    const at::Tensor order = std::get<1>(p.sort(0, true));
    const int64_t a = order[0].item<int64_t>(), b = order[1].item<int64_t>();
    auto kl = [&](const at::Tensor& q) { return (p * (p / q).log()).sum().item<double>(); };
    at::Tensor level = p.clone();
    level[a] = level[b] = (p[a] + p[b]) / 2;
    EXPECT_NEAR(kl(level), f, 1e-12);
    for (int k = 0; k < 200; ++k) {
      at::Tensor q = p * at::exp(at::randn({6}, at::kDouble) * 0.3);
      q[a] = q[b] = (q[a] + q[b]) / 2;
      q = q / q.sum();
      EXPECT_GE(kl(q), f - 1e-12);
    }
    EXPECT_LE(f, std::log(2.0));
  }
}

// Under a KL budget the tokens row accepts a parting whose flip costs no more than the budget, and
// fails it where the budget is smaller than that flip's cost: the same target, the same parting.
TEST(BudgetParting, IsTheBudgetsOwnOnlyWhereItsMarginIsThatNarrow) {
  // The trained fixture (on untrained weights greedy decoding repeats one token and never parts) and
  // the seed's first gotcha, whose ids part within a few steps.
  Fixture fx = load_fixture(data_dir(), at::kCPU);
  EquivalenceOptions o = options(main_prompt(), 80);
  ModelTarget strict_target(fx.model, cache_registry().get("rope-offset"));
  const auto strict = run_checks(fx.model, o, strict_target, {"tokens"});
  ASSERT_EQ(strict.checks[0].status, Status::Fail) << strict.checks[0].detail;
  ASSERT_TRUE(strict.first_difference);
  EXPECT_EQ(strict.checks[0].stats.count("flip_kl_at_parting"), 0u) << "no budget, no flip cost";
  const Reference ref = build_reference(fx.model, o.prompt, o.tokens);
  const double flip = flip_kl(ref.uncached_logits.select(1, strict.identical_prefix));
  for (const double budget : {flip * 2, flip / 2}) {
    o.tolerance.max_kl = budget;
    ModelTarget t(fx.model, cache_registry().get("rope-offset"));
    const auto r = run_checks(fx.model, o, t, {"tokens"});
    EXPECT_EQ(r.checks[0].status, budget > flip ? Status::Pass : Status::Fail) << r.checks[0].detail;
    EXPECT_DOUBLE_EQ(r.checks[0].stats.at("flip_kl_at_parting"), flip);
    EXPECT_EQ(r.first_difference, strict.first_difference);
  }
}

// What serving engines do to a cache, on the production caches: every serving check passes and
// batch sizes 1-8, 15-17 and 31-33 are measured; a cache that cannot fork (the CUDA graph's ring) is skipped, saying why.
TEST_F(Harness, TheProductionCachesPassWhatServingEnginesDo) {
  const std::vector<std::string> serving = {"ragged", "join-leave", "fork", "rollback", "shared-prefix", "batch-sizes"};
  for (const char* name : {"rolling", "static"}) {
    ModelTarget t(model, cache_registry().get(name));
    const auto r = run_checks(model, opts, t, serving);
    ASSERT_EQ(r.checks.size(), serving.size());
    for (const auto& c : r.checks) EXPECT_EQ(c.status, Status::Pass) << name << " " << c.name << ": " << c.detail;
    const CheckResult& sizes = r.checks.back();
    for (int b = 1; b <= 33; ++b)
      EXPECT_EQ(sizes.stats.count("invariance_b" + std::to_string(b)), b <= 8 || (b >= 15 && b <= 17) || b >= 31 ? 1u : 0u) << b;
    EXPECT_EQ(sizes.stats.at("invariance_b1"), 0.0) << "a batch of one is the row alone";
  }
  CacheVariant ring;
  ring.name = "ring";
  ring.make_cache = [](const Config& c) { return std::make_unique<RingKVCache>(c); };
  ModelTarget t(model, ring);
  const auto r = run_checks(model, opts, t, {"fork"});
  EXPECT_EQ(r.checks[0].status, Status::Skipped);
  EXPECT_NE(r.checks[0].detail.find("ring"), std::string::npos) << r.checks[0].detail;
}

// A target that forwards to our model, except that a chunk appended to a row loses its first token:
// the bug of engines whose cache misses the last generated token when tokens are appended after
// generating (a chunk of a prompt loses its first token the same way).
// A target that forwards every operation to our model through one cache variant; the planted
// targets below change one of them. It does not forward reused(): it never says what it reused.
class Forwarding : public DecodeTarget, public RowServing {
 public:
  Forwarding(GPT model, const CacheVariant& v) : inner_(std::move(model), v) {}
  int64_t context() const override { return inner_.context(); }
  void reset() override { inner_.reset(); }
  at::Tensor prefill(const at::Tensor& ids) override { return inner_.prefill(ids); }
  at::Tensor step(const at::Tensor& ids) override { return inner_.step(ids); }
  Offers make_offers() const override { return forwarded_offers(inner_); }
  RowServing& serving() override { return *this; }
  std::vector<int64_t> add_rows(const std::vector<std::vector<int64_t>>& p, at::Tensor& l) override { return inner_.add_rows(p, l); }
  at::Tensor step_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids) override { return inner_.step_rows(rows, ids); }
  at::Tensor extend_row(int64_t row, const std::vector<int64_t>& ids) override { return inner_.extend_row(row, ids); }
  void release_row(int64_t row) override { inner_.release_row(row); }
  int64_t fork_row(int64_t row) override { return inner_.fork_row(row); }
  void truncate_row(int64_t row, int64_t n) override { inner_.truncate_row(row, n); }
  std::string save_row(int64_t row) override { return inner_.save_row(row); }
  int64_t restore_row(const std::string& state) override { return inner_.restore_row(state); }
  void shift_row(int64_t row, int64_t keep, int64_t discard) override { inner_.shift_row(row, keep, discard); }

 protected:
  ModelTarget inner_;
};

class ChunkLosesItsFirstToken final : public Forwarding {
 public:
  using Forwarding::Forwarding;
  std::string name() const override { return "planted: a chunk loses its first token"; }
  at::Tensor extend_row(int64_t row, const std::vector<int64_t>& ids) override {
    if (ids.size() < 2) return inner_.extend_row(row, ids);
    return inner_.extend_row(row, std::vector<int64_t>(ids.begin() + 1, ids.end()));
  }
};

TEST_F(Harness, ChunkedPrefillPassesOurCachesAndFailsAChunkThatLosesAToken) {
  for (const char* name : {"rolling", "static"}) {
    ModelTarget t(model, cache_registry().get(name));
    const auto r = run_checks(model, opts, t, {check::kChunkedPrefill});
    EXPECT_EQ(r.checks[0].status, Status::Pass) << name << ": " << r.checks[0].detail;
    EXPECT_LT(*r.checks[0].figure, 1e-5) << name;
  }
  ChunkLosesItsFirstToken bad(model, cache_registry().get("static"));
  const auto r = run_checks(model, opts, bad, {check::kChunkedPrefill});
  EXPECT_EQ(r.checks[0].status, Status::Fail) << r.checks[0].detail;
  // Judged at each chunk's end against the reference first: the row names where the chunking parts.
  EXPECT_NE(r.checks[0].detail.find("at each chunk's end: first over"), std::string::npos) << r.checks[0].detail;
  EXPECT_TRUE(r.checks[0].stats.count("first_over")) << r.checks[0].detail;
  // A target without the operation is skipped, saying so.
  CacheVariant ring;
  ring.name = "ring";
  ring.make_cache = [](const Config& c) { return std::make_unique<RingKVCache>(c); };
  ModelTarget t(model, ring);
  EXPECT_EQ(run_checks(model, opts, t, {check::kChunkedPrefill}).checks[0].status, Status::Skipped);
}

// prefix-reuse on our caches: RowBatch keeps every shared entry but never a prompt's last token,
// and the row says so; beside each hit a miss. A target that does not say what it reused passes and
// the row says that instead.
class SaysNothingOfReuse final : public Forwarding {
 public:
  using Forwarding::Forwarding;
  std::string name() const override { return "a target that does not report reuse"; }
};

TEST_F(Harness, PrefixReusePassesOurCachesSayingWhatTheyReused) {
  // The small model's 8-token prompt (a quarter of its 32-token window): shares of 9, 8, 5, 4, 3, 1.
  for (const char* name : {"rolling", "static"}) {
    ModelTarget t(model, cache_registry().get(name));
    const auto r = run_checks(model, opts, t, {check::kPrefixReuse});
    EXPECT_EQ(r.checks[0].status, Status::Pass) << name << ": " << r.checks[0].detail;
    EXPECT_NE(r.checks[0].detail.find("reused/shared: 8/9, 7/8, 5/5, 4/4, 3/3, 1/1"), std::string::npos) << r.checks[0].detail;
    EXPECT_LT(*r.checks[0].figure, 1e-5) << name;
  }
  SaysNothingOfReuse quiet(model, cache_registry().get("static"));
  const auto r = run_checks(model, opts, quiet, {check::kPrefixReuse});
  EXPECT_EQ(r.checks[0].status, Status::Pass) << r.checks[0].detail;
  EXPECT_NE(r.checks[0].detail.find("does not say what it reused"), std::string::npos) << r.checks[0].detail;
  // The planted edge: a prompt cached whole keeps every entry and feeds its last token after them.
  ModelTarget bad(model, cache_registry().get("reused-prefix-too-long"));
  const auto f = run_checks(model, opts, bad, {check::kPrefixReuse});
  EXPECT_EQ(f.checks[0].status, Status::Fail) << f.checks[0].detail;
  EXPECT_NE(f.checks[0].detail.find("sharing 9 tokens (the target reused 9)"), std::string::npos) << f.checks[0].detail;
}

TEST_F(Harness, ForkPastTheWindowCatchesAForkThatLosesTheOffset) {
  ModelTarget good(model, cache_registry().get("static"));
  const auto g = run_checks(model, opts, good, {check::kFork});
  EXPECT_EQ(g.checks[0].status, Status::Pass) << g.checks[0].detail;
  // The second fork: 32 + 64 + 16 - 3 steps in, the parent's entries no longer start at slot 0.
  EXPECT_NE(g.checks[0].detail.find("forked after 16 and 109 steps"), std::string::npos) << g.checks[0].detail;
  ModelTarget bad(model, cache_registry().get("fork-loses-the-offset"));
  const auto b = run_checks(model, opts, bad, {check::kFork});
  EXPECT_EQ(b.checks[0].status, Status::Fail) << b.checks[0].detail;
  EXPECT_NE(b.checks[0].detail.find("the child forked after 109 steps"), std::string::npos) << b.checks[0].detail;
}

// A target whose logits move by `shift` (at one id) whenever it runs on more than one thread: a race.
class ThreadDependent final : public DecodeTarget {
 public:
  ThreadDependent(GPT model, const CacheVariant& v, double shift) : inner_(std::move(model), v), shift_(shift) {}
  std::string name() const override { return "planted: logits depend on the thread count"; }
  int64_t context() const override { return inner_.context(); }
  void reset() override { inner_.reset(); }
  at::Tensor prefill(const at::Tensor& ids) override { return moved(inner_.prefill(ids)); }
  at::Tensor step(const at::Tensor& ids) override { return moved(inner_.step(ids)); }
  Offers make_offers() const override { return inner_.offers(); }
  int set_threads(int n) override { return inner_.set_threads(n); }

 private:
  at::Tensor moved(at::Tensor l) {  // (B, V)
    if (at::get_num_threads() > 1) l.select(-1, 7).add_(shift_);
    return l;
  }
  ModelTarget inner_;
  double shift_;
};

// thread-counts: our caches give the same run at 1, 2 and every core's threads (within the tolerance;
// bitwise where measured so); a race over the tolerance fails, and one under it fails only when
// --require-thread-invariance asks. The thread count is put back however the row ends.
TEST_F(Harness, ThreadCountsPassOurCachesAndFailARace) {
  const int before = at::get_num_threads();
  EquivalenceOptions o = opts;
  o.thread_counts = {1, 2, 3};
  for (const char* name : {"rolling", "static"}) {
    ModelTarget t(model, cache_registry().get(name));
    const auto r = run_checks(model, o, t, {check::kThreadCounts});
    EXPECT_EQ(r.checks[0].status, Status::Pass) << name << ": " << r.checks[0].detail;
    EXPECT_EQ(r.checks[0].stats.count("threads_2"), 1u) << name;
    EXPECT_EQ(r.checks[0].stats.count("threads_3"), 1u) << name;
    EXPECT_EQ(at::get_num_threads(), before) << name;
  }
  ThreadDependent race(model, cache_registry().get("static"), 0.05);
  const auto bad = run_checks(model, o, race, {check::kThreadCounts});
  EXPECT_EQ(bad.checks[0].status, Status::Fail) << bad.checks[0].detail;
  EXPECT_NE(bad.checks[0].detail.find("2 threads"), std::string::npos) << bad.checks[0].detail;
  EXPECT_EQ(at::get_num_threads(), before);
  ThreadDependent tiny(model, cache_registry().get("static"), 1e-5);
  EXPECT_EQ(run_checks(model, o, tiny, {check::kThreadCounts}).checks[0].status, Status::Pass);
  o.require_thread_invariance = true;
  ThreadDependent tiny2(model, cache_registry().get("static"), 1e-5);
  const auto strict = run_checks(model, o, tiny2, {check::kThreadCounts});
  EXPECT_EQ(strict.checks[0].status, Status::Fail) << strict.checks[0].detail;
  EXPECT_GT(*strict.checks[0].figure, 0);
}

// --require-batch-invariance: a difference under the tolerance fails only when asked.
TEST_F(Harness, BatchInvarianceFailsOnlyWhenRequired) {
  ModelTarget t(model, cache_registry().get("rolling"));
  const auto measured = run_checks(model, opts, t, {"batch-sizes"});
  ASSERT_EQ(measured.checks[0].status, Status::Pass) << measured.checks[0].detail;
  double worst = 0;
  for (const auto& [k, v] : measured.checks[0].stats) worst = std::max(worst, v);
  EquivalenceOptions strict = opts;
  strict.require_batch_invariance = true;
  ModelTarget t2(model, cache_registry().get("rolling"));
  const auto judged = run_checks(model, strict, t2, {"batch-sizes"});
  EXPECT_EQ(judged.checks[0].status, worst > 0 ? Status::Fail : Status::Pass) << judged.checks[0].detail;
}

// --batch-sizes: the row runs the sizes asked and no others; sizes none of which the target takes skip it.
TEST_F(Harness, BatchSizesRunsTheSizesAsked) {
  EquivalenceOptions o = opts;
  o.batch_sizes = {2, 5};
  ModelTarget t(model, cache_registry().get("rolling"));
  const auto r = run_checks(model, o, t, {"batch-sizes"}).checks[0];
  ASSERT_EQ(r.status, Status::Pass) << r.detail;
  std::set<std::string> keys;
  for (const auto& [k, v] : r.stats) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"invariance_b2", "invariance_b5"}));
  EXPECT_NE(r.detail.find("batch sizes 2,5,"), std::string::npos) << r.detail;
  o.batch_sizes = {5, 2};
  EXPECT_THROW(validate(o), std::invalid_argument);
  o.batch_sizes = {0, 2};
  EXPECT_THROW(validate(o), std::invalid_argument);
}

// A model's fp32 noise floor grows with its logits; verify keeps the seed's bound where five times the
// floor is under it and raises it to ten times the floor, saying so, where it is not (the final norm
// x1000: logits x1000); the self bound with it.
TEST(NoiseFloor, GrowsWithTheLogitsAndRaisesVerifysBound) {
  Config cfg;
  GPT quiet(cfg, 0);
  quiet->eval();
  const double f0 = fp32_noise_floor(quiet);
  EXPECT_LT(f0 * kNoiseFloorTrigger, kLogitTolerance);
  GPT loud(cfg, 0);
  loud->eval();
  {
    at::NoGradGuard no_grad;
    loud->named_parameters()["norm.weight"].mul_(1000);
  }
  const double f1 = fp32_noise_floor(loud);
  EXPECT_GT(f1, 100 * f0);
  ASSERT_GT(f1 * kNoiseFloorTrigger, kLogitTolerance);
  Fixture fx;
  fx.model = loud;
  VerifyOptions o;
  o.tokens = 8;
  o.checks = {"tokens", "logits"};
  o.faults.emplace();
  std::vector<std::string> said;
  o.progress = [&](const std::string& s) { said.push_back(s); };
  const VerifyReport rep = run_verify(fx, o);
  EXPECT_TRUE(std::any_of(said.begin(), said.end(), [](const std::string& s) { return s.rfind("logit bound ", 0) == 0; }));
  ASSERT_FALSE(rep.matrix.controls.empty());
  EXPECT_GT(rep.matrix.controls[0].tolerance, kLogitTolerance);
  EXPECT_GE(rep.matrix.controls[0].tolerance, f1 * kNoiseFloorMargin);
  EXPECT_LT(rep.matrix.controls[0].tolerance, 2 * f1 * kNoiseFloorMargin);
  EXPECT_NE(rep.matrix.controls[0].tolerance_reason.find("this model's own fp32 noise"), std::string::npos);
  // The user's bound is theirs.
  o.tolerance = 1e-3;
  said.clear();
  const VerifyReport mine = run_verify(fx, o);
  EXPECT_EQ(mine.matrix.controls[0].tolerance, 1e-3);
  EXPECT_FALSE(std::any_of(said.begin(), said.end(), [](const std::string& s) { return s.rfind("logit bound ", 0) == 0; }));
}

// The check table: every check written once, named once; conform and equivalence run its rows.
TEST(CheckTable, NamesAreUniqueAndEveryRowIsComplete) {
  const auto names = check_names();
  std::set<std::string> unique(names.begin(), names.end());
  EXPECT_EQ(unique.size(), names.size());
  for (const auto& c : model_checks()) {
    EXPECT_FALSE(c.proves.empty()) << c.name;
    EXPECT_FALSE(c.catches.empty()) << c.name;
    EXPECT_FALSE(c.is(Tag::Sampler)) << c.name;
    EXPECT_EQ(&find_check(c.name), &c) << c.name;
  }
  EXPECT_GT(sampler_checks().size(), 10u);
  for (const auto& c : sampler_checks()) {
    EXPECT_EQ(c.name.rfind(check::kSamplerPrefix, 0), 0u) << c.name;
    EXPECT_TRUE(c.is(Tag::Sampler)) << c.name;
    EXPECT_EQ(c.judge, Judge::Law) << c.name;
  }
  EXPECT_THROW(find_check("nope"), std::invalid_argument);
}

// Every selection is the table's tags: the default set, what our own caches run, the serving faults'
// runs, what conform runs on an engine's sampler.
TEST(CheckTable, SelectionsAreDerivedFromTheTags) {
  EXPECT_EQ(kChecks, (std::vector<std::string>{"tokens", "logits", "window-reference", "reset", "teacher-forced", "sampled",
                                               "long-prompt", "batch"}));
  const auto ours = model_checks_with(0, static_cast<Tags>(Tag::EngineOnly));
  EXPECT_EQ(ours.size() + 2, model_checks().size()) << "every row but the engine-only self and served";
  EXPECT_EQ(std::count(ours.begin(), ours.end(), "self"), 0);
  EXPECT_EQ(std::count(ours.begin(), ours.end(), "served"), 0);
  const auto ops = row_operation_checks();
  for (const char* n : {"ragged", "join-leave", "fork", "rollback"}) EXPECT_EQ(std::count(ops.begin(), ops.end(), n), 1) << n;
  for (const auto& c : model_checks())
    EXPECT_EQ(std::count(ops.begin(), ops.end(), c.name), !c.ops.empty() && c.is(Tag::Serving) && !c.is(Tag::EngineOnly) ? 1 : 0) << c.name;
  for (const auto& c : model_checks()) EXPECT_EQ(c.is(Tag::Serving) && c.ops.empty(), c.name == "batch-sizes") << c.name;
  const auto conformed = conform_selection({"sampler"});
  for (const auto& n : conformed) EXPECT_FALSE(find_check(n).is(Tag::NeedsScores)) << n;
  EXPECT_LT(conformed.size(), sampler_checks().size()) << "the laws that read filtered scores are left out";
  EXPECT_THROW(conform_selection({"nope"}), std::invalid_argument);
}

// A deviation touches rows by how they are judged and their tags; a name the table lacks is refused.
TEST(CheckTable, DeviationsTouchTheRowsTheirJudgesAndTagsSelect) {
  auto touches = [](const Deviation* d, const std::string& n) {
    const auto t = d->touched();
    return std::find(t.begin(), t.end(), n) != t.end();
  };
  // gelu-tanh: every row judged against a reference, the target's own prefill, or a row alone.
  const Deviation* gelu = find_deviation("gelu-tanh");
  ASSERT_NE(gelu, nullptr);
  for (const char* n : {"logits", "window-reference", "teacher-forced", "sampled", "long-prompt", "batch", "self", "ragged",
                        "join-leave", "fork", "rollback", "batch-sizes"})
    EXPECT_TRUE(touches(gelu, n)) << n;
  for (const char* n : {"tokens", "reset"}) EXPECT_FALSE(touches(gelu, n)) << n << ": greedy ids and a rerun are not relaxed";
  for (const auto& c : model_checks())
    EXPECT_EQ(touches(gelu, c.name), c.judge == Judge::Reference || c.judge == Judge::Self || c.judge == Judge::Invariance) << c.name;
  // rope-angle-recurrence: the reference rows that reach past the window, where the angle error has grown.
  const Deviation* rope = find_deviation("rope-angle-recurrence");
  ASSERT_NE(rope, nullptr);
  for (const char* n : {"window-reference", "teacher-forced", "sampled", "long-prompt", "batch", "ragged", "join-leave", "fork", "rollback"})
    EXPECT_TRUE(touches(rope, n)) << n;
  for (const char* n : {"logits", "self", "batch-sizes"}) EXPECT_FALSE(touches(rope, n)) << n;
  for (const auto& c : model_checks())
    EXPECT_EQ(touches(rope, c.name), c.judge == Judge::Reference && c.is(Tag::PastWindow)) << c.name;
  EXPECT_EQ(find_deviation("top-k-exact")->touched(), std::vector<std::string>{"sampler/topKDrawsEveryTokenTiedWithTheKth"});
  Deviation bad = *gelu;
  bad.checks = {"no-such-check"};
  EXPECT_THROW(validate_deviation(bad), std::invalid_argument);
  Deviation none;
  none.name = "touches-nothing";
  EXPECT_THROW(validate_deviation(none), std::invalid_argument);
}

// A fault naming a check the table does not have is refused when it is registered.
TEST(CacheRegistry, AFaultNamingAnUnknownCheckIsRefused) {
  CacheRegistry r;
  CacheVariant v;
  v.name = "planted-typo";
  v.make_cache = [](const Config& c) { return std::make_unique<RollingKVCache>(c); };
  v.is_fault = true;
  v.expected = {"window-refrence"};
  try {
    r.add(v);
    FAIL() << "registered a fault expecting an unknown check";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("window-refrence"), std::string::npos) << e.what();
  }
  v.expected = {"window-reference"};
  v.checks = {"rollbak"};
  EXPECT_THROW(r.add(v), std::invalid_argument);
  v.checks = {"rollback"};
  EXPECT_NO_THROW(r.add(v));
}

// Inside a check, CheckFailure means "the target is wrong" (fail); anything else is an error.
TEST_F(Harness, ACheckFailsOnCheckFailureAndErrsOnAnythingElse) {
  ModelTarget target(model, cache_registry().get("rolling"));
  EquivalenceResult out;
  CheckContext ctx(model, opts, target, out);
  auto row = [](std::string name, std::function<void(CheckContext&, CheckResult&)> run) {
    CheckDef d;
    d.name = std::move(name);
    d.run = std::move(run);
    return d;
  };
  const CheckResult fail = run_check(row("planted-fail", [](CheckContext&, CheckResult&) { throw CheckFailure("wrong shape"); }), ctx);
  EXPECT_EQ(fail.status, Status::Fail);
  EXPECT_EQ(fail.detail, "wrong shape");
  const CheckResult err = run_check(row("planted-error", [](CheckContext&, CheckResult&) { throw std::runtime_error("gone\nbacktrace"); }), ctx);
  EXPECT_EQ(err.status, Status::Error);
  EXPECT_EQ(err.detail, "error: gone") << "the first line only";
  EXPECT_FALSE(err.ok());
}

// The printers agree on the four verdicts.
TEST(Results, EveryPrinterShowsTheFourVerdicts) {
  std::vector<CheckResult> rows(4);
  const Status st[] = {Status::Pass, Status::Fail, Status::Error, Status::Skipped};
  for (int i = 0; i < 4; ++i) rows[i].name = std::string("c") + std::to_string(i), rows[i].status = st[i], rows[i].detail = "d & <" + std::to_string(i) + ">";
  EXPECT_FALSE(all_ok(rows));
  EXPECT_EQ(worst(rows), Status::Error);
  EXPECT_EQ(worst({rows[0], rows[3]}), Status::Pass);
  EXPECT_EQ(worst({rows[3]}), Status::Skipped);
  EXPECT_TRUE(all_ok({rows[0], rows[3]})) << "skipped is not a failure";
  const std::string table = format_table(rows, "verify");
  for (const char* v : {"PASS", "FAIL", "ERROR", "SKIP"}) EXPECT_NE(table.find(v), std::string::npos) << v;
  EXPECT_NE(table.find("verify: FAILED (1 failed, 1 errors of 4 checks)"), std::string::npos) << table;
  const auto j = to_json(rows);
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["counts"]["error"], 1);
  EXPECT_EQ(j["checks"][2]["status"], "error");
  EXPECT_EQ(j["checks"][3]["passed"], true);
  const std::string x = junit_xml(rows, "tinygpt.verify");
  EXPECT_NE(x.find("failures=\"1\" errors=\"1\" skipped=\"1\""), std::string::npos) << x;
  EXPECT_NE(x.find("<error message=\"d &amp; &lt;2&gt;\"/>"), std::string::npos) << x;
  EXPECT_NE(x.find("<skipped message="), std::string::npos) << x;
  const std::string md = markdown_table(rows);
  EXPECT_NE(md.find("| c2 | **ERROR** |"), std::string::npos) << md;
  EXPECT_EQ(status_from_string("skipped"), Status::Skipped);
  EXPECT_THROW(status_from_string("maybe"), std::invalid_argument);
}

TEST(CacheRegistry, ACacheRegisteredAtRunTimeJoinsTheChecks) {
  register_cache("test-rolling-copy", "the rolling cache under another name",
                 [](const Config& c) { return std::make_unique<RollingKVCache>(c); });
  EXPECT_THROW(register_cache("test-rolling-copy", "again", [](const Config& c) { return std::make_unique<RollingKVCache>(c); }),
               std::invalid_argument);
  bool listed = false;
  for (const auto* v : cache_registry().all(false)) listed |= v->name == "test-rolling-copy";
  EXPECT_TRUE(listed);
  EXPECT_EQ(cache_registry().get("test-rolling-copy").decoder(small_config()).path.kernels, Kernels::Library);
}

TEST(CacheRegistry, UnknownNameListsTheKnownOnes) {
  try {
    cache_registry().get("nope");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rope-offset"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tinygpt::checks

namespace tinygpt::checks {
namespace {

// One matrix model, one vocabulary: the console, JSON, Markdown and HTML views print the same symbol
// for every cell. The faults chosen give every kind of cell: caught (and caught*), missed, error
// (a fault that throws) and not run (a serving fault runs only the row-operation checks).
TEST_F(Harness, TheFaultMatrixPrintsTheSameSymbolsInEveryView) {
  CacheVariant throws;
  throws.name = "planted-throws";
  throws.description = "throws on the first decode step";
  throws.make_cache = [](const Config& c) { return std::make_unique<ThrowsOnDecode>(c); };
  throws.is_fault = true;
  throws.expected = {check::kLogits};
  InjectionOptions io;
  io.drift_tokens = 20;
  io.fault_tokens = 40;
  io.fault_side_tokens = 8;
  io.controls = {&cache_registry().get("static")};
  io.control_checks = {check::kTokens};
  const auto rep = run_injection(model, opts, {&cache_registry().get("rope-offset"), &cache_registry().get("joined-row-at-batch-position"), &throws}, io);
  const FaultMatrix m = fault_matrix(rep);
  std::set<std::string> kinds;
  for (const auto& row : m.cells)
    for (const auto& c : row) kinds.insert(cell_symbol(c));
  for (const char* k : {"caught*", "caught", "missed", "ERROR*", "error", "not run"}) EXPECT_TRUE(kinds.count(k)) << k;

  const std::string console = format_injection(rep);
  const nlohmann::json json = to_json(rep);
  tools::ReportInput in;
  in.command = "inject";
  in.injection = &rep;
  in.context = model->config().context;
  const std::string md = tools::render_markdown(in), html = tools::render_html(in);
  ASSERT_EQ(json["matrix"]["checks"].get<std::vector<std::string>>(), m.checks);
  for (size_t i = 0; i < m.faults.size(); ++i) {
    SCOPED_TRACE(m.faults[i]->fault);
    std::string md_row;
    for (size_t k = 0; k < m.checks.size(); ++k) {
      const std::string sym = cell_symbol(m.cells[i][k]);
      EXPECT_EQ(json["matrix"]["rows"][i]["cells"][k], sym);
      md_row += " " + sym + " |";
    }
    // Console: each symbol starts in its check's column (columns fit their longest entry).
    const std::string header = console.substr(0, console.find('\n'));
    const size_t at = console.find("\n" + m.faults[i]->fault + " ");
    ASSERT_NE(at, std::string::npos) << console;
    const std::string line = console.substr(at + 1, console.find('\n', at + 1) - at - 1);
    size_t col = m.faults[i]->fault.size();
    for (size_t k = 0; k < m.checks.size(); ++k) {
      col = header.find(" " + m.checks[k] + " ", col) + 1;
      ASSERT_NE(col, std::string::npos + 1) << header;
      EXPECT_EQ(line.substr(col, cell_symbol(m.cells[i][k]).size()), cell_symbol(m.cells[i][k])) << header << "\n" << line;
      EXPECT_EQ(line[col - 1], ' ') << line;
    }
    EXPECT_NE(md.find(md_row), std::string::npos) << md;
    size_t pos = html.find("<td>" + m.faults[i]->fault + "</td>");
    ASSERT_NE(pos, std::string::npos);
    for (size_t k = 0; k < m.checks.size(); ++k) {
      pos = html.find("\">" + cell_symbol(m.cells[i][k]) + "</td>", pos);
      EXPECT_NE(pos, std::string::npos) << "cell " << k;
    }
  }
  // The legend is in every human view.
  for (const std::string* view : {&console, &md, &html}) EXPECT_NE(view->find("not run: not part of the fault's run"), std::string::npos);
}

}  // namespace
}  // namespace tinygpt::checks
