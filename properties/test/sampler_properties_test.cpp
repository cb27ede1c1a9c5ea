// Our own sampler suite is the conformance kit's, instantiated on the production sampler:
// `Production/SamplerLaw.Holds/<law>_<cpu|cuda>` and `Production/SamplerCheck.Holds/<check>_<...>`.
// CUDA cases run when LibTorch sees a GPU and skip, saying why, otherwise. A failing law prints
// RapidCheck's reproduce string (see README: replaying a failure).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "tinygpt/conformance/sampler_suite.h"
#include "tinygpt/laws/sampler_laws.h"

TINYGPT_SAMPLER_CONFORMANCE_WITH_ROWS(Production, tinygpt::props::production_sampler().filtered,
                                      tinygpt::props::production_sampler().pick, tinygpt::props::production_sampler().pick_rows);

namespace tinygpt::props {
namespace {

// The same filtered distribution on both devices, so a CUDA kernel difference cannot hide.
TEST(SamplerDevices, CpuAndCudaFilteredProbabilitiesAgree) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA case skipped: this LibTorch has no usable CUDA device";
  at::Generator g = at::detail::createCPUGenerator(9);
  at::Tensor x = at::randn({8, 4096}, g) * 3;
  at::Tensor h = at::randint(0, 4096, {8, 20}, g, at::kLong);
  for (auto s : {SamplingSettings{0.7, 0, 0.9, 1.3}, SamplingSettings{1.2, 40, 1.0, 1.0}, SamplingSettings{0.8, 40, 0.9, 1.3},
                 SamplingSettings{1.0, 0, 1.0, 1.0}}) {
    at::Tensor cpu = filtered_probs(x, h, s);
    at::Tensor cuda = filtered_probs(x.cuda(), h.cuda(), s).cpu();
    EXPECT_LT((cpu - cuda).abs().max().item<double>(), 1e-6) << s.to_string();
  }
}

TEST(ChiSquare, CriticalValuesMatchTables) {
  // Tabulated chi-square upper critical values: df=5 at 1e-3 is 20.515, df=10 at 1e-2 is 23.209.
  EXPECT_NEAR(chi_square_critical(5, 1e-3), 20.515, 0.3);
  EXPECT_NEAR(chi_square_critical(10, 1e-2), 23.209, 0.2);
}

}  // namespace
}  // namespace tinygpt::props
