// Both generation paths (SPEC 3-4) on untrained weights: the cache changes nothing inside the
// window, trims to context, and past the window matches the banded no-cache reference.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "tinygpt/attention_policy.h"
#include "tinygpt/generate.h"
#include "tinygpt/graph_step.h"
#include "tinygpt/ring_kv_cache.h"
#include "tinygpt/static_kv_cache.h"

#include <torch/cuda.h>

namespace tinygpt {
namespace {

class Generate : public ::testing::Test {
 protected:
  void SetUp() override { model->eval(); }
  Config cfg;
  GPT model{cfg, 0};
  at::NoGradGuard no_grad;
};

TEST_F(Generate, PrefillLogitsEqualUncachedLastPosition) {
  at::Tensor idx = at::tensor({5, 17, 300, 2, 9, 4000, 11}, at::kLong).repeat({2, 1});  // (2, 7)
  RollingKVCache cache(cfg);
  at::Tensor cached = model->step(idx, cache, 0);          // (2, V)
  at::Tensor full = model->forward(idx).select(1, 6);      // (2, V)
  EXPECT_LT((cached - full).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(cache.length(), 7);
}

TEST_F(Generate, GreedyIdenticalInsideTheWindowBatch1) {
  at::Tensor prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  const int64_t n = cfg.context - 3;  // 253
  RollingKVCache cache(cfg);
  at::Tensor a = generate_uncached(model, prompt, n, greedy());
  at::Tensor b = generate_cached(model, prompt, n, greedy(), cache);
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_TRUE(a.equal(b));
}

TEST_F(Generate, GreedyIdenticalInsideTheWindowBatch4) {
  // Four different prompts of one length, so rows really differ. The window is the seed's; a narrower,
  // shallower model keeps the uncached batch of four (252 forwards of up to 256 tokens) to seconds,
  // and batch 1 above runs the seed's own shape.
  Config small = cfg;
  small.d_model = 128;
  small.n_layers = 2;
  GPT m(small, 0);
  m->eval();
  at::Tensor prompt = at::tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, at::kLong).view({4, 4});
  const int64_t n = small.context - 4;
  RollingKVCache cache(small);
  at::Tensor a = generate_uncached(m, prompt, n, greedy());
  at::Tensor b = generate_cached(m, prompt, n, greedy(), cache);
  EXPECT_TRUE(a.equal(b));
  EXPECT_FALSE(a[0].equal(a[1])) << "rows with different prompts should differ";
}

TEST_F(Generate, CacheTrimsToContextAndCountsBytes) {
  RollingKVCache cache(cfg);
  at::Tensor prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  generate_cached(model, prompt, 300, greedy(), cache);
  EXPECT_EQ(cache.length(), cfg.context);
  // 2 (K and V) x layers x tokens x d_model x 4 bytes = 3.00 MiB at batch 1.
  EXPECT_EQ(cache.bytes(), 2 * 6 * 256 * 256 * 4);
}

// Past the window the rolling cache computes a banded attention: query i sees keys
// i-context .. i. Teacher-force the cached path and compare every step with one banded forward.
TEST_F(Generate, CachedStepsEqualTheBandedReferencePastTheWindow) {
  at::Tensor prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  at::Tensor seq = generate_uncached(model, prompt, 330, greedy());  // (1, 333)
  at::Tensor ref = model->forward_with(seq, BandedPolicy(cfg.context + 1));  // (1, 333, V)
  RollingKVCache cache(cfg);
  double worst = model->step(seq.narrow(1, 0, 3), cache, 0).sub(ref.select(1, 2)).abs().max().item<double>();
  for (int64_t p = 3; p < seq.size(1); ++p) {
    at::Tensor got = model->step(seq.narrow(1, p, 1), cache, p);  // (1, V)
    worst = std::max(worst, (got - ref.select(1, p)).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-4);
  // And the plain causal forward really differs past the window, so the test has teeth.
  at::Tensor window = seq.narrow(1, seq.size(1) - cfg.context, cfg.context);
  at::Tensor plain = model->forward(window).select(1, cfg.context - 1);
  EXPECT_GT((plain - ref.select(1, seq.size(1) - 1)).abs().max().item<double>(), 1e-4);
}

// Stop ids end the loop once every row has chosen one: the rows are the run without stops, cut at
// the step where the last row stopped (a row that stopped first went on).
TEST_F(Generate, StopIdsEndTheLoopOnceEveryRowHasOne) {
  const at::Tensor prompt = at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3});  // (2, 3)
  RollingKVCache cache(cfg);
  const at::Tensor full = generate_cached(model, prompt, 40, greedy(), cache);  // (2, 43)
  // Row 0's id at step 5 and row 1's at step 11 (each the first time it appears in its row).
  auto first_at = [&](int64_t row, int64_t id) {
    for (int64_t i = 3; i < full.size(1); ++i)
      if (full[row][i].item<int64_t>() == id) return i;
    return int64_t{-1};
  };
  const int64_t a = full[0][3 + 5].item<int64_t>(), b = full[1][3 + 11].item<int64_t>();
  const at::Tensor cut = generate_cached(model, prompt, 40, greedy(), cache, {}, {}, {a, b});
  // The loop ends where both rows have met a stop id: the later of each row's first stop.
  auto first_stop = [&](int64_t row) {
    const int64_t x = first_at(row, a), y = first_at(row, b);
    return x < 0 ? y : y < 0 ? x : std::min(x, y);
  };
  const int64_t last = std::max(first_stop(0), first_stop(1));
  ASSERT_GT(last, 0);
  ASSERT_EQ(cut.size(1), last + 1);
  EXPECT_TRUE(cut.equal(full.narrow(1, 0, last + 1)));
  // An id no row chooses: every step runs.
  EXPECT_EQ(generate_cached(model, prompt, 40, greedy(), cache, {}, {}, {cfg.vocab_size + 7}).size(1), 43);
}

TEST_F(Generate, ChooserReceivesTheWholeHistory) {
  at::Tensor prompt = at::tensor({7, 8}, at::kLong).unsqueeze(0);
  std::vector<int64_t> lengths;
  TokenChooser spy = [&](const at::Tensor& logits, const at::Tensor& history) {
    lengths.push_back(history.size(1));
    return logits.argmax(-1);
  };
  RollingKVCache cache(Config{});
  generate_cached(model, prompt, 4, spy, cache);
  EXPECT_EQ(lengths, (std::vector<int64_t>{2, 3, 4, 5}));
}

TEST_F(Generate, RejectsAChooserReturningBadIds) {
  at::Tensor prompt = at::tensor({1}, at::kLong).unsqueeze(0);
  TokenChooser bad = [](const at::Tensor& logits, const at::Tensor&) {
    return at::full({logits.size(0)}, 4096, at::kLong);
  };
  EXPECT_THROW(generate_uncached(model, prompt, 1, bad), std::invalid_argument);
}

// The preallocated cache is pure data movement: at every step it hands attention exactly the keys
// and values the rolling cache does, across prefill, the window edge and its buffer wrap-around.
TEST(StaticKVCache, HandsOutWhatTheRollingCacheDoesAtEveryStep) {
  const int64_t ctx = 8;
  RollingKVCache rolling(2, ctx);
  StaticKVCache fixed(2, ctx);
  at::Generator gen = at::detail::createCPUGenerator(3);
  auto feed = [&](int64_t T) {
    for (int64_t layer = 0; layer < 2; ++layer) {
      at::Tensor k = at::randn({3, 2, T, 4}, gen), v = at::randn({3, 2, T, 4}, gen);
      auto [rk, rv] = rolling.update(layer, k, v);
      auto [sk, sv] = fixed.update(layer, k, v);
      ASSERT_TRUE(rk.equal(sk) && rv.equal(sv)) << "T " << T << " length " << rolling.length();
    }
    ASSERT_EQ(rolling.length(), fixed.length());
    ASSERT_EQ(rolling.bytes(), fixed.bytes());
  };
  feed(5);
  for (int i = 0; i < 40; ++i) feed(1);  // 5 windows: the buffer of 2 x 8 + 1 slots wraps twice
  fixed.reset();
  rolling.reset();
  EXPECT_EQ(fixed.length(), 0);
  EXPECT_EQ(fixed.bytes(), 0);
  feed(30);  // a prefill longer than the buffer: it grows
  feed(1);
  feed(3);   // several tokens on a full cache
}

TEST_F(Generate, StaticCacheMatchesRollingAndCountsBytes) {
  at::Tensor prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  RollingKVCache rolling(cfg);
  StaticKVCache fixed(cfg);
  std::vector<at::Tensor> a, b;
  at::Tensor x = generate_cached(model, prompt, 300, greedy(), rolling, {}, [&](int64_t, const at::Tensor& l) { a.push_back(l.clone()); });
  at::Tensor y = generate_cached(model, prompt, 300, greedy(), fixed, {}, [&](int64_t, const at::Tensor& l) { b.push_back(l.clone()); });
  EXPECT_TRUE(x.equal(y));
  EXPECT_LT((at::stack(a) - at::stack(b)).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(fixed.length(), cfg.context);
  EXPECT_EQ(fixed.bytes(), 2 * 6 * 256 * 256 * 4);              // the formula: 3.00 MiB
  EXPECT_EQ(fixed.capacity_bytes(), 2 * 6 * (2 * 256 + 1) * 256 * 4);  // room for context + context + 1
}

TEST_F(Generate, DecodeKernelsAgreeWithTheLibrary) {
  at::Tensor prompt = at::tensor({1, 2, 3, 4, 5, 6, 7, 8}, at::kLong).view({2, 4});
  StaticKVCache cache(cfg);
  std::vector<at::Tensor> a, b;
  DecodePath fast;
  fast.kernels = Kernels::Decode;
  at::Tensor x = generate_cached(model, prompt, 40, greedy(), cache, {}, [&](int64_t, const at::Tensor& l) { a.push_back(l.clone()); });
  at::Tensor y = generate_cached(model, prompt, 40, greedy(), cache, fast, [&](int64_t, const at::Tensor& l) { b.push_back(l.clone()); });
  EXPECT_TRUE(x.equal(y));
  const double d = (at::stack(a) - at::stack(b)).abs().max().item<double>();
  EXPECT_LT(d, 1e-5);
  EXPECT_GT(d, 0.0) << "the decode kernels sum in another order: identical logits would mean they never ran";
}

// The ring behind the CUDA graph step, through the reference step: the rolling cache's keys as a
// set (a decode query has no mask, so order does not matter), past the window and after a reset.
TEST_F(Generate, GraphRingRunsEagerlyAsTheRollingCache) {
  at::Tensor prompt = at::tensor({1, 2, 3, 9, 8, 7}, at::kLong).view({2, 3});
  RollingKVCache rolling(cfg);
  RingKVCache ring(cfg);
  std::vector<at::Tensor> a, b;
  at::Tensor x = generate_cached(model, prompt, 300, greedy(), rolling, {}, [&](int64_t, const at::Tensor& l) { a.push_back(l.clone()); });
  at::Tensor y = generate_cached(model, prompt, 300, greedy(), ring, {}, [&](int64_t, const at::Tensor& l) { b.push_back(l.clone()); });
  EXPECT_TRUE(x.equal(y));
  EXPECT_LT((at::stack(a) - at::stack(b)).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(ring.length(), cfg.context);
  EXPECT_EQ(ring.bytes(), 2 * 2 * 6 * 256 * 256 * 4);
  EXPECT_EQ(ring.capacity_bytes(), 2 * 2 * 6 * 257 * 256 * 4);
  ring.reset();
  EXPECT_EQ(ring.length(), 0);
  EXPECT_THROW(ring.update(0, at::zeros({1, 4, 257, 64}), at::zeros({1, 4, 257, 64})), std::invalid_argument);
  ring.update(0, at::zeros({1, 4, 3, 64}), at::zeros({1, 4, 3, 64}));
  EXPECT_THROW(ring.update(0, at::zeros({1, 4, 2, 64}), at::zeros({1, 4, 2, 64})), std::invalid_argument)
      << "after the prefill, one token at a time";
  // The graph step takes only its own ring; on the CPU a decode step is the reference step.
  GraphStep graph(ring);
  RingKVCache other(cfg);
  EXPECT_THROW(graph(*model, at::zeros({1, 1}, at::kLong), other, 3, Kernels::Library), std::logic_error);
}

// The function the CUDA graph captures, run eagerly on the CPU: the rolling cache's logits at every
// step, past the window twice over (the ring wraps), for a batch of two.
TEST_F(Generate, TheGraphStepMatchesTheRollingCache) {
  at::Tensor prompt = at::tensor({1, 2, 3, 9, 8, 7}, at::kLong).view({2, 3});
  RollingKVCache rolling(cfg);
  std::vector<at::Tensor> want;
  at::Tensor seq = generate_cached(model, prompt, 600, greedy(), rolling, {}, [&](int64_t, const at::Tensor& l) { want.push_back(l.clone()); });
  RingKVCache ring(cfg);
  GraphStep graph(ring);
  double worst = (graph(*model, prompt, ring, 0, Kernels::Library) - want[0]).abs().max().item<double>();
  for (int64_t i = 1; i < 600; ++i) {
    at::Tensor got = graph.eager(*model, seq.narrow(1, 3 + i - 1, 1), 3 + i - 1);  // (2, V)
    worst = std::max(worst, (got - want[i]).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(ring.length(), cfg.context);
  EXPECT_EQ(graph.captures(), 0) << "no graph on the CPU";
  EXPECT_THROW(graph.eager(*model, at::ones({3, 1}, at::kLong), 700), std::logic_error) << "another batch needs a prefill";
}

// A schedule that records what the loop asks it: the loop's bookkeeping goes through the seam.
class RecordingSchedule final : public DecodeSchedule {
 public:
  mutable std::vector<int64_t> positions;
  mutable int begins = 0;
  void begin(KVCache& c) const override {
    ++begins;
    DecodeSchedule::begin(c);
  }
  int64_t position(int64_t fed, int64_t context) const override {
    positions.push_back(fed);
    return DecodeSchedule::position(fed, context);
  }
};

TEST_F(Generate, TheLoopsBookkeepingGoesThroughTheSchedule) {
  RecordingSchedule rec;
  DecodePath path;
  path.schedule = &rec;
  RollingKVCache cache(cfg);
  at::Tensor prompt = at::arange(1, 301, at::kLong).unsqueeze(0);  // longer than the window
  generate_cached(model, prompt, 4, greedy(), cache, path);
  EXPECT_EQ(rec.begins, 1);
  EXPECT_EQ(rec.positions, (std::vector<int64_t>{256, 257, 258})) << "the prefill fed the last 256 tokens";
  EXPECT_EQ(production_schedule().prefill_start(300, 256), 44);
  EXPECT_EQ(production_schedule().prefill_start(3, 256), 0);
  EXPECT_EQ(production_schedule().position(1000, 256), 1000) << "never wrapped";
}

class BadPrefill final : public DecodeSchedule {
 public:
  int64_t prefill_start(int64_t prompt_len, int64_t) const override { return prompt_len; }
};

TEST_F(Generate, ASchedulePointingOutsideThePromptIsRefused) {
  BadPrefill bad;
  DecodePath path;
  path.schedule = &bad;
  RollingKVCache cache(cfg);
  EXPECT_THROW(generate_cached(model, at::tensor({1, 2}, at::kLong).unsqueeze(0), 2, greedy(), cache, path), std::logic_error);
}

}  // namespace
}  // namespace tinygpt
