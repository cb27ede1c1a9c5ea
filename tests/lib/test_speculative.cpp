// Speculative decoding (speculative.h): greedy equals plain greedy past the window, the verify step's
// logits equal one-token steps', rollbacks leave the cache a plain run would have, stops and budgets
// end mid-block, sample-and-match reproduces plain seeded decoding, and the exact rule's first token
// is distributed as the target's own sampler.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "tinygpt/generate.h"
#include "tinygpt/sampler.h"
#include "tinygpt/serving.h"
#include "tinygpt/speculative.h"
#include "../checks/small_model.h"

namespace tinygpt {
namespace {

// The harness tests' small model (a 32-token window: 50 new ids cross it).
Config small() { return checks::small_config(); }

// A member with a sliding layer and a full one, grouped KV heads: each layer rolls back its own window.
Config sliding() {
  Config c = small();
  c.n_kv_heads = 2;
  c.norm = NormKind::RMSNorm;
  c.layer_types = {LayerKind::Sliding, LayerKind::Full};
  c.sliding_window = 6;
  return c;
}

std::vector<int64_t> ids_of(const at::Tensor& row) {
  const at::Tensor r = row.to(at::kCPU).contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

class Speculative : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    cfg = GetParam() ? sliding() : small();
    target = GPT(cfg, 3);
    target->eval();
    // Untrained weights at the series' scale give near-equal logits and greedy runs of one repeated id;
    // larger weights give runs whose ids change, drafts that differ and stop ids to find.
    at::NoGradGuard g;
    for (auto& p : target->parameters()) p.mul_(3);
  }
  // Plain cached greedy from `prompt`: the new ids and each one's logits (n, V).
  std::pair<std::vector<int64_t>, at::Tensor> plain(const std::vector<int64_t>& prompt, int64_t n) {
    RollingKVCache cache(cfg);
    Recorder rec;
    const at::Tensor seq = generate_cached(target, at::tensor(prompt, at::kLong).unsqueeze(0), n, greedy(), cache, {}, rec.observer());
    const auto all = ids_of(seq[0]);
    return {std::vector<int64_t>(all.begin() + static_cast<int64_t>(prompt.size()), all.end()), rec.stacked()[0]};
  }
  // Plain cached steps teacher-forced along `next`: the logits each of its ids is chosen from (n, V).
  at::Tensor forced(const std::vector<int64_t>& prompt, const std::vector<int64_t>& next) {
    RollingKVCache cache(cfg);
    Recorder rec;
    size_t i = 0;
    generate_cached(target, at::tensor(prompt, at::kLong).unsqueeze(0), static_cast<int64_t>(next.size()),
                    [&](const at::Tensor&, const at::Tensor&) { return at::tensor(std::vector<int64_t>{next[i++]}, at::kLong); },
                    cache, {}, rec.observer());
    return rec.stacked()[0];
  }
  SpeculativeRun spec(Drafter& d, const std::vector<int64_t>& prompt, int64_t n, SpeculativeSettings s, int64_t then = 0) {
    SpeculativeDecoder dec(target, std::make_unique<RollingKVCache>(cfg));
    return dec.run(prompt, n, d, s, then);
  }
  Config cfg;
  GPT target{nullptr};
  at::NoGradGuard no_grad;
};

SpeculativeSettings greedy_settings(int64_t k) {
  SpeculativeSettings s;
  s.k = k;
  s.sampling.temperature = 0;
  return s;
}

// Temperature 0 is plain greedy, id for id, 50 tokens (three windows) past the prompt, at k = 1, 4, 8,
// with drafts that are always right (the target's own weights, and its plain run replayed: every draft
// accepted), never right (the argmin, and the plain run moved by one id: every draft rejected), right
// but at every third id (accepted in part) and prompt lookup; every new id's logits are a one-token step's.
TEST_P(Speculative, GreedyIsPlainGreedyForEveryDraftAndWidth) {
  const std::vector<int64_t> prompt = {1, 2, 3};
  const auto [want, want_logits] = plain(prompt, 50);
  std::vector<int64_t> whole = prompt;
  whole.insert(whole.end(), want.begin(), want.end());
  for (int64_t k : {1, 4, 8}) {
    ModelDrafter self(target), contrary(target, /*contrary=*/true);
    NgramDrafter ngram;
    ReplayDrafter replay(whole, cfg.vocab_size), wrong(whole, cfg.vocab_size, 1), wrong3(whole, cfg.vocab_size, 1, 3);
    for (Drafter* d : std::vector<Drafter*>{&self, &contrary, &ngram, &replay, &wrong, &wrong3}) {
      SCOPED_TRACE(d->name() + " k=" + std::to_string(k));
      const SpeculativeRun r = spec(*d, prompt, 50, greedy_settings(k));
      ASSERT_EQ(r.ids, want);
      EXPECT_LT((r.logits - want_logits).abs().max().item<double>(), 1e-4);
      if (d == &self || d == &replay) {
        EXPECT_EQ(r.accepted, r.drafted) << "the target drafting for itself is always right at temperature 0";
        EXPECT_GT(r.mean_accepted_length(), static_cast<double>(k));  // k drafts and the bonus, but the last round
      }
      if (d == &wrong3) {  // every third id wrong: rounds accepted in part
        EXPECT_GT(r.accepted, 0);
        EXPECT_LT(r.accepted, r.drafted);
      }
      if (d == &contrary || d == &wrong) {
        EXPECT_EQ(r.accepted, 0);
      }
    }
  }
}

// A prompt longer than the window: its last `context` ids are fed, the penalty sees every id.
TEST_P(Speculative, LongPromptAndPenaltyAtTemperatureZero) {
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < cfg.context + 7; ++i) prompt.push_back((i * 7 + 3) % cfg.vocab_size);
  SpeculativeSettings s = greedy_settings(4);
  s.sampling.penalty = 1.3;
  RollingKVCache cache(cfg);
  const at::Tensor seq = generate_cached(target, at::tensor(prompt, at::kLong).unsqueeze(0), 30, sampler(s.sampling), cache);
  const auto all = ids_of(seq[0]);
  ModelDrafter self(target);
  EXPECT_EQ(spec(self, prompt, 30, s).ids, std::vector<int64_t>(all.begin() + static_cast<int64_t>(prompt.size()), all.end()));
}

// After rounds that each rejected k drafts, the target's cache holds what a plain run over the same ids
// holds, on every layer (a sliding layer's window and history included), and plain steps go on from it
// as from a plain run.
TEST_P(Speculative, RejectedDraftsLeaveThePlainCache) {
  const std::vector<int64_t> prompt = {5, 6, 7};
  ModelDrafter contrary(target, /*contrary=*/true);
  SpeculativeDecoder dec(target, std::make_unique<RollingKVCache>(cfg));
  const SpeculativeRun r = dec.run(prompt, 40, contrary, greedy_settings(4), /*then_plain=*/8);
  ASSERT_EQ(r.accepted, 0);
  std::vector<int64_t> next = r.ids;
  next.insert(next.end(), r.then_ids.begin(), r.then_ids.end());
  const auto [want, _] = plain(prompt, 48);
  EXPECT_EQ(next, want);
  const at::Tensor f = forced(prompt, next);
  EXPECT_LT((r.then_logits - f.narrow(0, 40, 8)).abs().max().item<double>(), 1e-4);
  // The entries: a plain cache fed the same 3 + 40 ids but the newest.
  RollingKVCache plain_cache(cfg);
  std::vector<int64_t> seq = prompt;
  seq.insert(seq.end(), r.ids.begin(), r.ids.end());
  SpeculativeDecoder dec2(target, std::make_unique<RollingKVCache>(cfg));
  ModelDrafter contrary2(target, true);
  dec2.run(prompt, 40, contrary2, greedy_settings(4));
  const int64_t fed = static_cast<int64_t>(dec2.fed().size());
  EXPECT_EQ(fed, static_cast<int64_t>(seq.size()) - 1);
  for (int64_t t = 0; t < fed; ++t)
    target->step(at::tensor(std::vector<int64_t>{seq[static_cast<size_t>(t)]}, at::kLong).unsqueeze(0), plain_cache, t);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const auto [K, V] = dec2.cache().stored(l);
    const auto [Kp, Vp] = plain_cache.stored(l);
    ASSERT_EQ(K.sizes(), Kp.sizes()) << "layer " << l;
    EXPECT_LT((K - Kp).abs().max().item<double>(), 1e-5) << "layer " << l;
    EXPECT_LT((V - Vp).abs().max().item<double>(), 1e-5) << "layer " << l;
  }
}

// A stop id accepted inside a block ends the output there, and the cache holds exactly the ids before
// it; a budget that ends inside a block gives exactly the budget.
TEST_P(Speculative, StopIdAndBudgetEndInsideABlock) {
  const std::vector<int64_t> prompt = {1, 2, 3};
  // A penalty keeps the untrained model from repeating one id: its greedy ids are new for a while.
  SpeculativeSettings s = greedy_settings(8);
  s.sampling.penalty = 2.0;
  RollingKVCache plain_cache(cfg);
  const auto all = ids_of(generate_cached(target, at::tensor(prompt, at::kLong).unsqueeze(0), 40, sampler(s.sampling), plain_cache)[0]);
  const std::vector<int64_t> want(all.begin() + 3, all.end());
  // The first id that appears for the first time at index >= 3: the self draft accepts it mid-block.
  size_t at = 3;
  while (at < want.size() && std::find(want.begin(), want.begin() + static_cast<int64_t>(at), want[at]) != want.begin() + static_cast<int64_t>(at)) ++at;
  ASSERT_LT(at, 8u) << "no new id inside the first block: " << ::testing::PrintToString(want);
  s.stop = {want[at]};
  ModelDrafter self(target);
  SpeculativeDecoder dec(target, std::make_unique<RollingKVCache>(cfg));
  const SpeculativeRun r = dec.run(prompt, 40, self, s);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.ids, std::vector<int64_t>(want.begin(), want.begin() + static_cast<int64_t>(at) + 1));
  EXPECT_EQ(static_cast<int64_t>(dec.fed().size()), static_cast<int64_t>(prompt.size() + at));
  EXPECT_EQ(dec.cache().length(), std::min<int64_t>(cfg.cache_window(0), static_cast<int64_t>(prompt.size() + at)));
  ModelDrafter self2(target);
  SpeculativeSettings budget = s;
  budget.stop.clear();
  budget.k = 4;
  EXPECT_EQ(spec(self2, prompt, 7, budget).ids, std::vector<int64_t>(want.begin(), want.begin() + 7));
}

// Sample-and-match draws one id per new token from the target's stream: seeded, it is plain seeded
// decoding, draw for draw, whatever the draft.
TEST_P(Speculative, SampleAndMatchIsPlainSeededDecoding) {
  const std::vector<int64_t> prompt = {9, 8, 7};
  SpeculativeSettings s;
  s.k = 4;
  s.rule = AcceptRule::SampleAndMatch;
  s.sampling = SamplingSettings::every_stage();
  s.seed = 11;
  RollingKVCache cache(cfg);
  const at::Tensor seq = generate_cached(target, at::tensor(prompt, at::kLong).unsqueeze(0), 40,
                                         sampler(s.sampling, make_generator(at::kCPU, 11)), cache);
  const auto all = ids_of(seq[0]);
  const std::vector<int64_t> want(all.begin() + 3, all.end());
  ModelDrafter self(target);
  GPT other(cfg, 99);
  ModelDrafter draft(other);
  NgramDrafter ngram;
  for (Drafter* d : std::vector<Drafter*>{&self, &draft, &ngram}) EXPECT_EQ(spec(*d, prompt, 40, s).ids, want) << d->name();
}

// The exact rule with a draft model that disagrees with the target: the first new id's frequencies
// over 3,000 seeds against the target's own distribution (every sampler stage on), by chi-square.
TEST_P(Speculative, ExactRuleKeepsTheTargetsDistribution) {
  const std::vector<int64_t> prompt = {4, 4, 2, 9};
  SpeculativeSettings s;
  s.k = 3;
  s.sampling.temperature = 1.0;
  s.sampling.top_k = 20;
  s.sampling.penalty = 1.3;
  const at::Tensor p = filtered_probs(target->forward(at::tensor(prompt, at::kLong).unsqueeze(0)).select(1, 3),
                                      at::tensor(prompt, at::kLong).unsqueeze(0), s.sampling)[0];  // (V)
  GPT other(cfg, 99);
  const int N = 3000;
  std::map<int64_t, int> count;
  int64_t drafted = 0, accepted = 0;
  for (int i = 0; i < N; ++i) {
    ModelDrafter draft(other);
    s.seed = static_cast<uint64_t>(i);
    const SpeculativeRun r = spec(draft, prompt, 1, s);
    ++count[r.ids[0]];
    drafted += std::min<int64_t>(r.drafted, 1), accepted += r.accepted;
  }
  double chi2 = 0;
  int df = -1;
  for (int64_t v = 0; v < cfg.vocab_size; ++v) {
    const double e = N * p[v].item<double>();
    if (e < 1e-9) {
      EXPECT_EQ(count[v], 0) << "id " << v << " has probability 0";
      continue;
    }
    chi2 += (count[v] - e) * (count[v] - e) / e;
    ++df;
  }
  // 1e-6 false alarm at df <= 19: chi-square quantile below 60.
  EXPECT_LT(chi2, 60.0) << "df " << df;
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted) << "a draft of other weights should be rejected sometimes";
}

// RowBatch::verify: blocks of different lengths for rows at different positions, in one step, give
// each row's one-token steps' logits; the padding leaves no entry behind (the rows' next steps equal
// plain steps); past the window too.
TEST_P(Speculative, BatchedVerifyIsEachRowsOneTokenSteps) {
  const std::vector<int64_t> a = {1, 2, 3}, b = {7, 5, 3, 1, 2, 9, 4};
  auto block_of = [&](const std::vector<int64_t>& prompt, size_t len) {  // the plain run's next ids
    const auto ids = plain(prompt, static_cast<int64_t>(len)).first;
    return std::vector<int64_t>(ids.begin(), ids.end());
  };
  const std::vector<int64_t> ba = block_of(a, 4), bb = block_of(b, 1);
  RowBatch batch(*target, [this] { return std::make_unique<RollingKVCache>(cfg); }, DecodePath{});
  at::Tensor first;
  const auto rows = batch.add({a, b}, first);
  // Feed the prompts' last ids again as the blocks' first: drop them first, as a verify round does.
  batch.truncate(rows[0], 1), batch.truncate(rows[1], 1);
  std::vector<int64_t> blk_a = {a.back()}, blk_b = {b.back()};
  blk_a.insert(blk_a.end(), ba.begin(), ba.end());
  blk_b.insert(blk_b.end(), bb.begin(), bb.end());
  const VerifyPolicy policy(cfg.context);
  const auto L = batch.verify(rows, {blk_a, blk_b}, policy);
  ASSERT_EQ(L.size(), 2u);
  ASSERT_EQ(L[0].size(0), 5);
  ASSERT_EQ(L[1].size(0), 2);
  const at::Tensor fa = forced(a, std::vector<int64_t>(ba.begin(), ba.end()));  // (4, V): after a and each of ba but the last
  const at::Tensor fb = forced(b, bb);
  EXPECT_LT((L[0].narrow(0, 0, 4) - fa).abs().max().item<double>(), 1e-4);
  EXPECT_LT((L[1].narrow(0, 0, 1) - fb).abs().max().item<double>(), 1e-4);
  EXPECT_EQ(batch.next_position(rows[0]), 3 + 4);  // the prompt and the block after its first id
  EXPECT_EQ(batch.next_position(rows[1]), 7 + 1);
  // The next plain step of the shorter row sees no padding: its logits are the plain run's.
  const auto want_b = plain(b, 3);
  const at::Tensor next = batch.step({rows[1]}, {want_b.first[1]});
  EXPECT_LT((next[0] - want_b.second[2]).abs().max().item<double>(), 1e-4);
  EXPECT_THROW(batch.verify({rows[0], rows[0]}, {{1}, {2}}, policy), std::invalid_argument);
  EXPECT_THROW(batch.verify({rows[0]}, {{}}, policy), std::invalid_argument);
}

// Rows of a batch speculating in one RowBatch, each with a draft of its own (always right, right but at
// every third id, prompt lookup, never right; prompts of 1, 3 and window + 5 ids): each row's ids and
// logits are plain greedy's, each accepts its own count, and the rows' caches after the last round hold
// what plain runs hold (their next steps are plain steps). The same with the rollback skipped fails.
TEST_P(Speculative, BatchedRowsEachAcceptTheirOwnCount) {
  std::vector<int64_t> long_prompt;
  for (int64_t i = 0; i < cfg.context + 5; ++i) long_prompt.push_back((i * 11 + 5) % cfg.vocab_size);
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {9, 8, 7}, long_prompt, {4}};
  const int64_t n = 50;
  std::vector<std::vector<int64_t>> want, whole;
  std::vector<at::Tensor> want_logits;
  for (const auto& p : prompts) {
    auto [ids, logits] = plain(p, n + 1);
    want.emplace_back(ids.begin(), ids.end() - 1);
    want_logits.push_back(logits);
    whole.push_back(p);
    whole.back().insert(whole.back().end(), ids.begin(), ids.end());
  }
  auto run = [&](int64_t k, const SpeculativeRules& rules, RowBatch& batch) {
    size_t next = 0;
    auto make = [&]() -> std::unique_ptr<Drafter> {
      const size_t b = next++;
      if (b == 0) return std::make_unique<ReplayDrafter>(whole[0], cfg.vocab_size);
      if (b == 1) return std::make_unique<ReplayDrafter>(whole[1], cfg.vocab_size, 1, 3);
      if (b == 2) return std::make_unique<NgramDrafter>();
      return std::make_unique<ModelDrafter>(target, /*contrary=*/true);
    };
    return speculate_rows(batch, make, prompts, n, greedy_settings(k), rules);
  };
  auto make_cache = [this] { return std::make_unique<RollingKVCache>(cfg); };
  for (int64_t k : {1, 4, 8}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    RowBatch batch(*target, make_cache, DecodePath{});
    const auto runs = run(k, production_rules(), batch);
    ASSERT_EQ(runs.size(), prompts.size());
    for (size_t b = 0; b < runs.size(); ++b) {
      SCOPED_TRACE("row " + std::to_string(b));
      ASSERT_EQ(runs[b].ids, want[b]);
      EXPECT_LT((runs[b].logits - want_logits[b].narrow(0, 0, n)).abs().max().item<double>(), 1e-4);
    }
    EXPECT_EQ(runs[0].accepted, runs[0].drafted);
    EXPECT_GT(runs[1].accepted, 0);
    EXPECT_LT(runs[1].accepted, runs[1].drafted);
    EXPECT_EQ(runs[3].accepted, 0);
    EXPECT_NE(runs[0].accepted_per_round, runs[1].accepted_per_round);
    // Each row's next plain step, in one batch: the plain run's next logits.
    const auto rows = batch.rows();
    std::vector<int64_t> last;
    for (const auto& r : runs) last.push_back(r.ids.back());
    const at::Tensor next = batch.step(rows, last);  // (B, V)
    for (size_t b = 0; b < runs.size(); ++b)
      EXPECT_LT((next[static_cast<int64_t>(b)] - want_logits[b][n]).abs().max().item<double>(), 1e-4) << "row " << b;
  }
  SpeculativeRules kept = production_rules();
  kept.rollback = [](int64_t) { return int64_t{0}; };
  RowBatch batch(*target, make_cache, DecodePath{});
  const auto runs = run(4, kept, batch);
  EXPECT_NE(runs[1].ids, want[1]) << "rejected drafts left in a row's cache must change its ids";
}

// Sampled rows in one batch draw what each row alone draws with its seed (s.seed + b): the exact rule
// with a draft of other weights at temperature > 0.
TEST_P(Speculative, BatchedSampledRowsAreEachRowAlone) {
  const std::vector<std::vector<int64_t>> prompts = {{4, 4, 2, 9}, {1}, {3, 1, 4, 1, 5}};
  SpeculativeSettings s;
  s.k = 3;
  s.sampling = SamplingSettings::every_stage();
  s.seed = 21;
  GPT other(cfg, 99);
  RowBatch batch(*target, [this] { return std::make_unique<RollingKVCache>(cfg); }, DecodePath{});
  const auto runs = speculate_rows(batch, [&] { return std::make_unique<ModelDrafter>(other); }, prompts, 30, s);
  for (size_t b = 0; b < prompts.size(); ++b) {
    ModelDrafter draft(other);
    SpeculativeSettings alone = s;
    alone.seed = s.seed + b;
    const SpeculativeRun r = spec(draft, prompts[b], 30, alone);
    EXPECT_EQ(runs[b].ids, r.ids) << "row " << b;
    EXPECT_EQ(runs[b].accepted_per_round, r.accepted_per_round) << "row " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Speculative, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "SlidingGrouped" : "Seed"; });

TEST(SpeculativeParts, DrawFromIsTheInverseCdf) {
  const at::Tensor w = at::tensor(std::vector<float>{0, 2, 0, 1, 1});
  EXPECT_EQ(draw_from(w, 0.0), 1);
  EXPECT_EQ(draw_from(w, 0.49), 1);
  EXPECT_EQ(draw_from(w, 0.5), 3);
  EXPECT_EQ(draw_from(w, 0.76), 4);
  EXPECT_EQ(draw_from(w, 0.999999), 4);
  EXPECT_THROW(draw_from(at::zeros({3}), 0.5), std::invalid_argument);
}

TEST(SpeculativeParts, NgramProposesWhatFollowedTheLastMatch) {
  NgramDrafter d(2, 1);
  at::Generator g = make_generator(at::kCPU, 0);
  SamplingSettings s;
  EXPECT_EQ(d.propose({1, 2, 3, 9, 1, 2, 3, 7, 1, 2}, 3, s, g, production_rules()).ids, (std::vector<int64_t>{3, 7, 1}));
  EXPECT_EQ(d.propose({5, 6, 7}, 3, s, g, production_rules()).ids, std::vector<int64_t>{});
  EXPECT_EQ(d.propose({5, 6, 5}, 4, s, g, production_rules()).ids, (std::vector<int64_t>{6, 5}));
}

// Replayed ids: the next k of the sequence from the current length, those at multiples of the period
// moved by the shift (mod the vocabulary); nothing past its end; bad arguments refused.
TEST(SpeculativeParts, ReplayProposesTheSequencesNextIdsMovedWhereItSays) {
  at::Generator g = make_generator(at::kCPU, 0);
  SamplingSettings s;
  const std::vector<int64_t> seq = {1, 2, 3, 4, 5, 6, 7, 9};
  EXPECT_EQ(ReplayDrafter(seq, 10).propose({1, 2, 3}, 3, s, g, production_rules()).ids, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(ReplayDrafter(seq, 10, 1).propose({1, 2, 3}, 2, s, g, production_rules()).ids, (std::vector<int64_t>{5, 6}));
  // Period 3: from index 4 the ids 5, 6, 7, 9; index 6 (a multiple of 3) moved by one: 7 -> 8.
  EXPECT_EQ(ReplayDrafter(seq, 10, 1, 3).propose({1, 2, 3, 4}, 4, s, g, production_rules()).ids, (std::vector<int64_t>{5, 6, 8, 9}));
  EXPECT_EQ(ReplayDrafter({9, 9}, 10, 1).propose({9}, 4, s, g, production_rules()).ids, std::vector<int64_t>{0});  // wraps
  EXPECT_TRUE(ReplayDrafter(seq, 10).propose(seq, 4, s, g, production_rules()).ids.empty());
  EXPECT_THROW(ReplayDrafter(seq, 10, 10), std::invalid_argument);
  EXPECT_THROW(ReplayDrafter(seq, 10, 1, 0), std::invalid_argument);
  EXPECT_THROW(ReplayDrafter(seq, 8), std::invalid_argument);  // id 9 outside a vocabulary of 8
}

TEST(SpeculativeParts, BadSettingsAreRefusedByName) {
  SpeculativeSettings s;
  s.k = 0;
  EXPECT_THROW(s.validate(), std::invalid_argument);
  s.k = 4;
  s.sampling.top_p = 0;
  EXPECT_THROW(s.validate(), std::invalid_argument);
  EXPECT_THROW(parse_accept_rule("greedy"), std::invalid_argument);
  EXPECT_EQ(parse_accept_rule("sample-and-match"), AcceptRule::SampleAndMatch);
}

}  // namespace
}  // namespace tinygpt

