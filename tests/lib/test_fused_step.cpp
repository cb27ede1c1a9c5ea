// The fused CPU decode step (fused_step.h) against the model's own step with the decode kernels:
// the same function, so the same logits bit for bit at every batch size, inside and past the
// window and across the static cache's compaction; anything it does not take falls back.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "kernel_paths.h"

#include <chrono>

#include "tinygpt/fused_step.h"
#include "tinygpt/generate.h"
#include "tinygpt/kernel_step.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt {
namespace {

class FusedStep : public OnEveryKernelPath {};

Config small() {
  Config c;
  c.vocab_size = 96;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.context = 16;
  return c;
}

// Greedy runs of n tokens through a static cache, once through the model's Decode step and once
// through the fused step; every step's logits (B, n, V) of each.
std::pair<at::Tensor, at::Tensor> both(GPT& model, const at::Tensor& prompt, int64_t n) {
  const Config& cfg = model->config();
  StaticKVCache a(cfg), b(cfg);
  FusedCpuStep fused(b);
  DecodePath plain, fast;
  plain.kernels = fast.kernels = Kernels::Decode;
  fast.step = &fused;
  Recorder ra, rb;
  generate_cached(model, prompt, n, greedy(), a, plain, ra.observer());
  generate_cached(model, prompt, n, greedy(), b, fast, rb.observer());
  return {ra.stacked(), rb.stacked()};
}

TEST_P(FusedStep, EqualsTheModelsDecodeStepBitForBitAtEveryBatchSize) {
  Config cfg;  // the series' shapes: d 256, 4 heads of 64, 6 layers, context 256
  GPT model(cfg, 3);
  model->eval();
  at::NoGradGuard ng;
  for (int64_t B : {1, 2, 4, 16}) {
    const at::Tensor prompt = (at::arange(1, 1 + 5 * B, at::kLong) * 37 % cfg.vocab_size).view({B, 5});  // (B, 5)
    const auto [plain, fused] = both(model, prompt, 270);  // past the window (256)
    ASSERT_EQ(plain.sizes(), fused.sizes());
    EXPECT_TRUE(plain.equal(fused)) << "batch " << B << ": max |diff| " << (plain - fused).abs().max().item<double>();
  }
}

TEST_P(FusedStep, EqualsItAcrossTheCachesCompaction) {
  // Context 16: the buffer of 2 x (16 + 64) + 1 slots fills and the live entries move to the front
  // every ~80 steps; 400 steps cross that several times.
  const Config cfg = small();
  GPT model(cfg, 5);
  model->eval();
  at::NoGradGuard ng;
  const at::Tensor prompt = at::tensor({3, 1, 4, 1, 5, 9}, at::kLong).view({2, 3});
  const auto [plain, fused] = both(model, prompt, 400);
  EXPECT_TRUE(plain.equal(fused)) << "max |diff| " << (plain - fused).abs().max().item<double>();
}

TEST_P(FusedStep, LeavesWhatItDoesNotTakeToTheModelsStep) {
  Config cfg = small();
  GPT model(cfg, 7);
  model->eval();
  at::NoGradGuard ng;
  StaticKVCache a(cfg), b(cfg);
  FusedCpuStep fused(b);
  const at::Tensor prompt = at::tensor({1, 2, 3, 4}, at::kLong).view({1, 4});
  // A prefill is the decode path's step (kernel_step.h), a Library-kernels step the model's own: the same
  // tensors as calling them directly.
  EXPECT_TRUE(fused(*model, prompt, b, 0, Kernels::Decode).equal(step_with(*model, prompt, a, 0, production_policy(), Kernels::Decode)));
  const at::Tensor next = at::tensor({5}, at::kLong).view({1, 1});
  EXPECT_TRUE(fused(*model, next, b, 4, Kernels::Library).equal(model->step(next, a, 4, production_policy())));
  // Bound to one cache: another one is refused, not silently written past.
  StaticKVCache other(cfg);
  EXPECT_THROW(fused(*model, next, other, 5, Kernels::Decode), std::logic_error);
}

// The profile `tinygpt bench --profile` prints: every part of every one-token step timed (a prefill
// is the model's step and not counted), the parts inside the steps' own time, and nothing counted
// once the profile is detached.
TEST_P(FusedStep, ProfileTimesEveryPartOfItsSteps) {
  const Config cfg = small();
  GPT model(cfg, 9);
  model->eval();
  at::NoGradGuard ng;
  StaticKVCache cache(cfg);
  FusedCpuStep fused(cache);
  FusedStepProfile prof;
  fused.set_profile(&prof);
  const at::Tensor prompt = at::tensor({1, 2, 3, 4}, at::kLong).view({2, 2});
  fused(*model, prompt, cache, 0, Kernels::Decode);  // a prefill: the model's step
  EXPECT_EQ(prof.steps, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < 30; ++i) fused(*model, at::tensor({5, 6}, at::kLong).view({2, 1}), cache, 2 + i, Kernels::Decode);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(prof.steps, 30);
  double sum = 0;
  for (int i = 0; i < FusedStepProfile::kParts; ++i) {
    const auto part = static_cast<FusedStepProfile::Part>(i);
    EXPECT_GT(prof.seconds[static_cast<size_t>(i)], 0.0) << FusedStepProfile::name(part);
    EXPECT_STRNE(FusedStepProfile::name(part), "?");
    sum += prof.seconds[static_cast<size_t>(i)];
  }
  EXPECT_LE(sum, wall);
  fused.set_profile(nullptr);
  fused(*model, at::tensor({7, 8}, at::kLong).view({2, 1}), cache, 32, Kernels::Decode);
  EXPECT_EQ(prof.steps, 30);
}

TINYGPT_ON_EVERY_KERNEL_PATH(FusedStep);

}  // namespace
}  // namespace tinygpt
