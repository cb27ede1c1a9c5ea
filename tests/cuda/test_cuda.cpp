// The CUDA half of the suite: the same checks on a GPU. Every case skips, saying why, where
// LibTorch sees no CUDA device (Debian's LibTorch has none); ci/gpu-check.sh runs them on one.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "tinygpt/tools/cross_device.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/checks/inject.h"
#include "tinygpt/generate.h"
#include "tinygpt/graph_step.h"
#include "tinygpt/ring_kv_cache.h"

namespace tinygpt::checks {
namespace {

using namespace tinygpt::tools;

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA case skipped: this LibTorch has no usable CUDA device"

const c10::Device kCuda(c10::kCUDA, 0);

Fixture fixture(c10::Device d) { return load_fixture(checks::data_dir(), d); }

TEST(Cuda, CpuAndCudaAgreeByNormalisedSquaredError) {
  SKIP_WITHOUT_CUDA();
  Fixture cpu = fixture(c10::Device(c10::kCPU)), gpu = fixture(kCuda);
  const at::Tensor prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  for (const auto* v : cache_registry().all(false)) {
    const auto r = cross_device(cpu.model, gpu.model, prompt, 128, *v, *v);
    EXPECT_TRUE(r.passed()) << format_cross_device(r);
    EXPECT_LT(r.worst_forward, kNmseTolerance);
  }
}

TEST(Cuda, EveryProductionCachePassesEveryCheckOnTheFixture) {
  SKIP_WITHOUT_CUDA();
  Fixture fx = fixture(kCuda);
  EquivalenceOptions opts;
  opts.prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0).to(kCuda);
  opts.tokens = 320;
  const auto ref = build_reference(fx.model, opts);
  bool saw_graph = false;
  for (const auto* v : cache_registry().all(false)) {
    const auto r = check_equivalence(fx.model, opts, ref, *v);
    EXPECT_TRUE(r.passed()) << v->name << "\n" << format_equivalence(r);
    saw_graph |= v->name == "cuda-graph";
  }
  EXPECT_TRUE(saw_graph) << "the CUDA graph path registers itself where CUDA exists";
}

TEST(Cuda, EveryFaultIsCaughtOnTheGpu) {
  SKIP_WITHOUT_CUDA();
  Config c;
  c.vocab_size = 256;
  c.d_model = 64;
  c.n_layers = 2;
  c.context = 32;
  GPT model(c, 11);
  model->to(kCuda);
  model->eval();
  EquivalenceOptions opts;
  opts.prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0).to(kCuda);
  opts.tokens = 80;
  const auto rep = run_injection(model, opts, cache_registry().all(true));
  EXPECT_TRUE(rep.passed()) << format_injection(rep);
}

// The graph path against the series' rolling cache on the same tokens (teacher-forced), past the
// window, and one capture per batch size.
TEST(Cuda, GraphReplayEqualsTheRollingCacheAndCapturesOncePerBatch) {
  SKIP_WITHOUT_CUDA();
  Fixture fx = fixture(kCuda);
  at::NoGradGuard no_grad;
  const at::Tensor prompt = at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3}).to(kCuda);
  RollingKVCache rolling(fx.model->config());
  Recorder want;
  at::Tensor seq = generate_cached(fx.model, prompt, 600, greedy(), rolling, {}, want.observer());
  RingKVCache ring(fx.model->config());
  GraphStep graph(ring);
  double worst = (graph(*fx.model, prompt, ring, 0, Kernels::Library) - want.steps()[0]).abs().max().item<double>();
  for (int64_t i = 1; i < 600; ++i) {
    at::Tensor got = graph(*fx.model, seq.narrow(1, 3 + i - 1, 1), ring, 3 + i - 1, Kernels::Library);
    worst = std::max(worst, (got - want.steps()[i]).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(graph.captures(), 1);
  DecodePath replay;
  replay.step = &graph;
  generate_cached(fx.model, prompt, 10, greedy(), ring, replay);
  EXPECT_EQ(graph.captures(), 1) << "a new sequence of the same batch replays the same graph";
  generate_cached(fx.model, prompt.narrow(0, 0, 1), 10, greedy(), ring, replay);
  EXPECT_EQ(graph.captures(), 2) << "another batch size captures anew";
}

TEST(Cuda, GoldensHoldOnTheGpu) {
  SKIP_WITHOUT_CUDA();
  Fixture fx = fixture(kCuda);
  for (const auto* v : cache_registry().all(false))
    for (const auto& g : verify_goldens(fx, kCuda, v->name == "rolling" ? nullptr : v))
      EXPECT_TRUE(g.ok()) << g.name << ": " << g.detail;
}

}  // namespace
}  // namespace tinygpt::checks
