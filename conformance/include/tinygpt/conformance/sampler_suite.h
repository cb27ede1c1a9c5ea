// The sampler conformance suite: every law of tinygpt's property suite (RapidCheck; a failure
// prints its reproduce string) and every fixed check (the seed's self-check; the chi-square test of
// 20,000 draws against the plain SPEC 6 model), on CPU and CUDA, for a sampler of yours. In a test
// binary linking tinygpt::conformance and GTest::gtest_main, one line:
//
//   TINYGPT_SAMPLER_CONFORMANCE(MySampler, my_filtered, my_pick);
//
//   my_filtered(logits (B, V), history (B, T) or undefined, settings) -> (B, V) float scores the
//     draw uses: -inf where a stage dropped the token (temperature > 0);
//   my_pick(logits, history, settings) -> (B) int64 ids (temperature 0 = argmax after the penalty).
//
// A sampler whose batch rows carry their own settings and seeds (a serving engine's) also runs the
// row-state laws with
//
//   TINYGPT_SAMPLER_CONFORMANCE_WITH_ROWS(MySampler, my_filtered, my_pick, my_pick_rows);
//
//   my_pick_rows(logits, history, std::vector<tinygpt::RowSampling> rows, n) -> (B, n) int64 ids: row b
//     drawn n times with rows[b].settings from a generator of its own seeded with rows[b].seed.
// Without it those laws skip, saying so.
//
// Tests: MySampler/SamplerLaw.Holds/<law>_<cpu|cuda> and MySampler/SamplerCheck.Holds/<check>_<...>;
// CUDA cases skip, saying why, where LibTorch sees no GPU. Replay one failure with
// RC_PARAMS="reproduce=<string>" and --gtest_filter on its name. Include this header in one file.
#pragma once

#include <c10/core/Device.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "tinygpt/laws/sampler_under_test.h"

namespace tinygpt::conformance {

struct SamplerCase {
  props::SamplerUnderTest sut;
  size_t index = 0;  // into props::generated_laws() or props::fixed_checks()
  c10::Device device{c10::kCPU};
};

// How GoogleTest prints a case (instead of its bytes).
void PrintTo(const SamplerCase& c, std::ostream* os);

class SamplerLaw : public ::testing::TestWithParam<SamplerCase> {};
class SamplerCheck : public ::testing::TestWithParam<SamplerCase> {};

// Every law (or fixed check) on CPU and CUDA for `sut`.
std::vector<SamplerCase> sampler_law_cases(const props::SamplerUnderTest& sut);
std::vector<SamplerCase> sampler_check_cases(const props::SamplerUnderTest& sut);
std::string sampler_law_name(const ::testing::TestParamInfo<SamplerCase>& info);
std::string sampler_check_name(const ::testing::TestParamInfo<SamplerCase>& info);
// Referenced by the macro so the linker keeps the suite's tests (they live in a static library).
bool sampler_suite_linked();

}  // namespace tinygpt::conformance

// INSTANTIATE_TEST_SUITE_P pastes the suite's name into identifiers: it must be unqualified here.
#define TINYGPT_SAMPLER_CONFORMANCE_WITH_ROWS(Name, filtered, pick, pick_rows)                              \
  [[maybe_unused]] static const bool tinygpt_sampler_suite_##Name = ::tinygpt::conformance::sampler_suite_linked(); \
  using ::tinygpt::conformance::SamplerLaw;                                                                 \
  using ::tinygpt::conformance::SamplerCheck;                                                               \
  INSTANTIATE_TEST_SUITE_P(Name, SamplerLaw,                                                                \
                           ::testing::ValuesIn(::tinygpt::conformance::sampler_law_cases(                   \
                               ::tinygpt::props::SamplerUnderTest{#Name, #Name, filtered, pick, pick_rows})), \
                           ::tinygpt::conformance::sampler_law_name);                                       \
  INSTANTIATE_TEST_SUITE_P(Name, SamplerCheck,                                                              \
                           ::testing::ValuesIn(::tinygpt::conformance::sampler_check_cases(                 \
                               ::tinygpt::props::SamplerUnderTest{#Name, #Name, filtered, pick, pick_rows})), \
                           ::tinygpt::conformance::sampler_check_name)
#define TINYGPT_SAMPLER_CONFORMANCE(Name, filtered, pick) TINYGPT_SAMPLER_CONFORMANCE_WITH_ROWS(Name, filtered, pick, nullptr)
