// Kernel launches per cached decode step on CUDA, per production cache (the seed counted ~317 for
// its PyTorch step at batch 1; the GPU idled ~80% of the step). Counted with LibTorch's Kineto
// profiler: the CUDA kernels recorded while one decode step runs. Built only with a CUDA LibTorch.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/generate.h"

using namespace tinygpt;

namespace {

// Kernels the profiler saw while `fn` ran (memcpy and memset activities excluded), -1 if none was
// recorded at all (no CUPTI on this machine).
int64_t count_kernels(const std::function<void()>& fn) {
  namespace tp = torch::profiler::impl;
  namespace ap = torch::autograd::profiler;
  const tp::ProfilerConfig cfg(tp::ProfilerState::KINETO);
  const std::set<tp::ActivityType> acts{tp::ActivityType::CPU, tp::ActivityType::CUDA};
  ap::prepareProfiler(cfg, acts);
  ap::enableProfiler(cfg, acts);
  fn();
  torch::cuda::synchronize();
  auto result = ap::disableProfiler();
  int64_t n = 0, any = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    ++any;
    const std::string name = e.name();
    if (name.rfind("Memcpy", 0) == 0 || name.rfind("Memset", 0) == 0) continue;
    ++n;
  }
  return any ? n : -1;
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("kernel_count: no CUDA device\n");
    return 0;
  }
  const c10::Device dev(c10::kCUDA, 0);
  checks::Fixture fx = checks::load_fixture(checks::data_dir(), dev);
  at::NoGradGuard no_grad;
  std::printf("%-12s %5s %18s %14s\n", "cache", "batch", "kernels per step", "us per step");
  for (const auto* v : checks::cache_registry().all(false))
    for (int64_t B : {1, 16}) {
      checks::Decoder d = v->decoder(fx.model->config());
      const at::Tensor prompt = at::randint(0, 4096, {B, 8}, at::TensorOptions().dtype(at::kLong).device(dev));
      decode_step(*fx.model, prompt, *d.cache, 0, d.path);
      const at::Tensor tok = at::ones({B, 1}, prompt.options());
      int64_t pos = 8;
      for (int i = 0; i < 5; ++i) decode_step(*fx.model, tok, *d.cache, pos++, d.path);  // warm (and capture)
      const int64_t kernels = count_kernels([&] { decode_step(*fx.model, tok, *d.cache, pos++, d.path); });
      torch::cuda::synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i) decode_step(*fx.model, tok, *d.cache, pos++, d.path);
      torch::cuda::synchronize();
      const double us = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 200 * 1e6;
      std::printf("%-12s %5lld %18lld %14.1f\n", v->name.c_str(), static_cast<long long>(B), static_cast<long long>(kernels), us);
    }
  return 0;
}
