// The bench's roofline: the bytes and FLOPs it charges each step of a run, counted by hand on a
// tiny model, and the bound it derives from them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "tinygpt/tools/bench.h"
#include "tinygpt/tools/read_pass.h"

namespace tinygpt::checks {
namespace {

using namespace tinygpt::tools;

Config tiny() {
  Config c;
  c.vocab_size = 16;
  c.d_model = 8;
  c.n_heads = 2;
  c.n_layers = 1;
  c.context = 4;
  return c;
}

// Weights: 12 d^2 per layer (768) + the tied head V d (128) = 896 floats = 3,584 bytes, read every
// step. Keys and values: 2 x layers x batch x S x d x 4 bytes. FLOPs per query row: 2 x 768 for the
// blocks, 2 x 128 for the head (last position only), 4 x d per key seen.
TEST(BenchBound, StepCostsCountWeightsKeysAndFlopsByHand) {
  const auto s = run_step_costs(tiny(), /*batch=*/1, /*prompt=*/2, /*tokens=*/4);
  ASSERT_EQ(s.size(), 4u);
  // Prefill of 2 tokens: no cached keys read; causal attention sees 1 + 2 = 3 keys in all.
  EXPECT_DOUBLE_EQ(s[0].bytes, 3584);
  EXPECT_DOUBLE_EQ(s[0].flops, 2 * 2 * 768 + 2 * 128 + 4 * 8 * 3);
  // Decode steps: 2, 3, then 4 cached entries (the window), each plus the new one.
  EXPECT_DOUBLE_EQ(s[1].bytes, 3584 + 2 * 3 * 8 * 4);
  EXPECT_DOUBLE_EQ(s[1].flops, 2 * 768 + 2 * 128 + 4 * 8 * 3);
  EXPECT_DOUBLE_EQ(s[2].bytes, 3584 + 2 * 4 * 8 * 4);
  EXPECT_DOUBLE_EQ(s[3].bytes, 3584 + 2 * 5 * 8 * 4) << "context + 1 keys on a full window (SPEC 4)";
  EXPECT_DOUBLE_EQ(s[3].flops, 2 * 768 + 2 * 128 + 4 * 8 * 5);
  // A batch multiplies the keys and the arithmetic, not the weights.
  const auto b = run_step_costs(tiny(), 2, 2, 4);
  EXPECT_DOUBLE_EQ(b[3].bytes, 3584 + 2 * 2 * 5 * 8 * 4);
  EXPECT_DOUBLE_EQ(b[3].flops, 2 * s[3].flops);
  // A prompt longer than the window is prefilled from its last context tokens.
  EXPECT_DOUBLE_EQ(run_step_costs(tiny(), 1, 9, 1)[0].flops, 2 * 4 * 768 + 2 * 128 + 4 * 8 * 10);
  EXPECT_THROW(run_step_costs(tiny(), 0, 2, 4), std::invalid_argument);
}

TEST(BenchBound, EachStepTakesTheSlowerOfReadingAndComputing) {
  const std::vector<StepCost> steps = {{100, 10}, {10, 100}};  // (bytes, FLOPs)
  EXPECT_DOUBLE_EQ(run_bound_seconds(steps, 10, 10), 20);    // 10 s reading, then 10 s computing
  EXPECT_DOUBLE_EQ(run_bound_seconds(steps, 100, 10), 11);   // 1 s (compute-bound both: 1, 10)
  EXPECT_THROW(run_bound_seconds(steps, 0, 10), std::invalid_argument);
}

// The bench's read pass: every element once, on one thread or two, chunk tails included.
TEST(ReadPass, SumsEveryElementOnAnyThreadCount) {
  const int threads = at::get_num_threads();
  at::Generator g = at::detail::createCPUGenerator(30);
  const at::Tensor buf = at::randn({3 * 16384 + 37}, g).abs();
  const double want = buf.to(at::kDouble).sum().item<double>();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    EXPECT_NEAR(read_pass(buf), want, 1e-5 * want) << t << " threads";
  }
  at::set_num_threads(threads);
  EXPECT_THROW(read_pass(buf.to(at::kDouble)), std::invalid_argument);
}

}  // namespace
}  // namespace tinygpt::checks
