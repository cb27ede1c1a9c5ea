// Every sampler law as a GoogleTest case, once per device: `SamplerLaws/Law.Holds/<law>_cpu`.
// CUDA cases run when LibTorch sees a GPU and are skipped (with the reason) otherwise.
// A failing law prints RapidCheck's reproduce string (see README: replaying a failure).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/cuda.h>

#include <ATen/ATen.h>

#include "sampler_laws.h"

namespace tinygpt::props {
namespace {

bool unavailable(c10::Device dev) { return dev.is_cuda() && !torch::cuda::is_available(); }
// GTEST_SKIP returns from the calling function, so it must sit in the test body itself.
#define SKIP_IF_UNAVAILABLE(dev) \
  if (unavailable(dev)) GTEST_SKIP() << "CUDA case skipped: this LibTorch has no usable CUDA device"

std::string device_name(const c10::Device& d) { return d.is_cuda() ? "cuda" : "cpu"; }
const std::vector<c10::Device> kDevices = {c10::Device(c10::kCPU), c10::Device(c10::kCUDA)};

class Law : public ::testing::TestWithParam<std::tuple<size_t, c10::Device>> {};

TEST_P(Law, Holds) {
  const auto [index, dev] = GetParam();
  SKIP_IF_UNAVAILABLE(dev);
  const auto law = generated_laws().at(index);
  const SamplerUnderTest sut = production_sampler();
  RecordProperty("formula", law.formula);
  rc::detail::checkGTest([&] { law.body(sut, dev); });
}

INSTANTIATE_TEST_SUITE_P(SamplerLaws, Law,
                         ::testing::Combine(::testing::Range<size_t>(0, generated_laws().size()),
                                            ::testing::ValuesIn(kDevices)),
                         [](const auto& info) {
                           return generated_laws().at(std::get<0>(info.param)).name + "_" +
                                  device_name(std::get<1>(info.param));
                         });

class Fixed : public ::testing::TestWithParam<std::tuple<size_t, c10::Device>> {};

TEST_P(Fixed, Holds) {
  const auto [index, dev] = GetParam();
  SKIP_IF_UNAVAILABLE(dev);
  const auto check = fixed_checks().at(index);
  EXPECT_EQ(check.run(production_sampler(), dev), "") << check.formula;
}

INSTANTIATE_TEST_SUITE_P(SamplerChecks, Fixed,
                         ::testing::Combine(::testing::Range<size_t>(0, fixed_checks().size()),
                                            ::testing::ValuesIn(kDevices)),
                         [](const auto& info) {
                           return fixed_checks().at(std::get<0>(info.param)).name + "_" +
                                  device_name(std::get<1>(info.param));
                         });

// The same filtered distribution on both devices, so a CUDA kernel difference cannot hide.
TEST(SamplerDevices, CpuAndCudaFilteredProbabilitiesAgree) {
  SKIP_IF_UNAVAILABLE(c10::Device(c10::kCUDA));
  at::Generator g = at::detail::createCPUGenerator(9);
  at::Tensor x = at::randn({8, 4096}, g) * 3;
  at::Tensor h = at::randint(0, 4096, {8, 20}, g, at::kLong);
  for (auto s : {SamplingSettings{0.7, 0, 0.9, 1.3}, SamplingSettings{1.2, 40, 1.0, 1.0},
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
