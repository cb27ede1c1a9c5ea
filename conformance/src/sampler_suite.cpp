#include "tinygpt/conformance/sampler_suite.h"

#include <rapidcheck/gtest.h>
#include <torch/cuda.h>

#include "tinygpt/laws/sampler_laws.h"

namespace tinygpt::conformance {

namespace {

const std::vector<c10::Device>& devices() {
  static const std::vector<c10::Device> d = {c10::Device(c10::kCPU), c10::Device(c10::kCUDA)};
  return d;
}

std::vector<SamplerCase> cases(const props::SamplerUnderTest& sut, size_t n) {
  std::vector<SamplerCase> out;
  for (size_t i = 0; i < n; ++i)
    for (const auto& d : devices()) out.push_back({sut, i, d});
  return out;
}

std::string suffix(const c10::Device& d) { return d.is_cuda() ? "_cuda" : "_cpu"; }

}  // namespace

// GTEST_SKIP returns from the function it is in, so it sits in each test body.
#define TINYGPT_SKIP_WITHOUT(dev) \
  if ((dev).is_cuda() && !torch::cuda::is_available()) GTEST_SKIP() << "CUDA case skipped: this LibTorch has no usable CUDA device"

TEST_P(SamplerLaw, Holds) {
  const SamplerCase& c = GetParam();
  TINYGPT_SKIP_WITHOUT(c.device);
  const auto law = props::generated_laws().at(c.index);
  if (law.rows && !c.sut.pick_rows)
    GTEST_SKIP() << "the sampler has no per-row settings and seeds (TINYGPT_SAMPLER_CONFORMANCE_WITH_ROWS gives them)";
  RecordProperty("formula", law.formula);
  rc::detail::checkGTest([&] { law.body(c.sut, c.device); });
}

TEST_P(SamplerCheck, Holds) {
  const SamplerCase& c = GetParam();
  TINYGPT_SKIP_WITHOUT(c.device);
  const auto check = props::fixed_checks().at(c.index);
  EXPECT_EQ(check.run(c.sut, c.device), "") << check.formula;
}

std::vector<SamplerCase> sampler_law_cases(const props::SamplerUnderTest& sut) {
  return cases(sut, props::generated_laws().size());
}

std::vector<SamplerCase> sampler_check_cases(const props::SamplerUnderTest& sut) {
  return cases(sut, props::fixed_checks().size());
}

std::string sampler_law_name(const ::testing::TestParamInfo<SamplerCase>& info) {
  return props::generated_laws().at(info.param.index).name + suffix(info.param.device);
}

std::string sampler_check_name(const ::testing::TestParamInfo<SamplerCase>& info) {
  return props::fixed_checks().at(info.param.index).name + suffix(info.param.device);
}

bool sampler_suite_linked() { return true; }

void PrintTo(const SamplerCase& c, std::ostream* os) { *os << c.sut.name << " on " << c.device; }

}  // namespace tinygpt::conformance
