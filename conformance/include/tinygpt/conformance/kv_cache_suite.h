// The KV-cache conformance suite: a cache of yours through every check tinygpt runs on its own, on
// the shipped fixture and on untrained weights, on CPU and CUDA. In a test binary linking
// tinygpt::conformance and GTest::gtest_main, one line:
//
//   TINYGPT_KV_CACHE_CONFORMANCE(MyCache, [](const tinygpt::Config& c) { return std::make_unique<MyCache>(c); });
//
// Tests (MyCache/KVCacheConformance.<test>/<fixture|untrained>_<cpu|cuda>):
//   PassesEveryEquivalenceCheck  the production loop's tokens and logits against the uncached run,
//                                the full forward and the banded window reference, reset, the
//                                teacher-forced loop, a sampled run, a prompt longer than the window
//                                and batch rows, past the window (context + 64 tokens)
//   LengthAndBytesFollowTheFormula  length() = min(tokens, context); bytes() = 2 x layers x batch x
//                                length x d_model x 4 (float32); capacity_bytes() >= bytes()
//   ResetStartsAFreshSequence    after reset(): length 0, and the next sequence's logits are a fresh cache's
//   BatchRowsEqualEachPromptAlone  four different prompts in one batch, each row against its prompt alone
//   LongRunsMatchTheBandedReference  2.5 windows of greedy decoding against the banded reference
// A failure prints what `tinygpt equivalence` prints: the failing check, the first position over
// the tolerance, the logit difference and the top-2 margin there. Include this header in one file.
#pragma once

#include <c10/core/Device.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/data.h"

namespace tinygpt::conformance {

struct CacheCase {
  std::string name;
  checks::CacheFactory factory;
  Kernels kernels = Kernels::Library;
  std::string registered;  // a variant of tinygpt's cache registry, by name (instead of `factory`)
  bool fixture = false;  // the shipped fixture, else untrained weights (seed 0)
  c10::Device device{c10::kCPU};
};

// How GoogleTest prints a case (instead of its bytes).
void PrintTo(const CacheCase& c, std::ostream* os);

class KVCacheConformance : public ::testing::TestWithParam<CacheCase> {};

// The cache on {fixture, untrained} x {cpu, cuda}.
std::vector<CacheCase> kv_cache_cases(const std::string& name, const checks::CacheFactory& factory,
                                      Kernels kernels = Kernels::Library);
// A cache of tinygpt's registry by name (its factory, kernels and step function as registered); its
// cases skip, saying so, where the name is not registered (cuda-graph registers only with CUDA).
std::vector<CacheCase> registered_cache_cases(const std::string& registered);
std::string kv_cache_case_name(const ::testing::TestParamInfo<CacheCase>& info);
// Referenced by the macro so the linker keeps the suite's tests; also points the suite at the
// installed package's data folder when the package recorded one.
bool kv_cache_suite_linked(const char* data_dir);

}  // namespace tinygpt::conformance

#ifndef TINYGPT_INSTALLED_DATA_DIR
#define TINYGPT_INSTALLED_DATA_DIR ""
#endif

// Optional third argument: the tinygpt::Kernels its decode steps use (default Kernels::Library).
// TINYGPT_REGISTERED_CACHE_CONFORMANCE(Name, "static") runs the kit on a cache of tinygpt's registry.
#define TINYGPT_KV_CACHE_CONFORMANCE(Name, ...)                                                                   \
  [[maybe_unused]] static const bool tinygpt_kv_cache_suite_##Name =                                            \
      ::tinygpt::conformance::kv_cache_suite_linked(TINYGPT_INSTALLED_DATA_DIR);                                \
  using ::tinygpt::conformance::KVCacheConformance;                                                             \
  INSTANTIATE_TEST_SUITE_P(Name, KVCacheConformance,                                                            \
                           ::testing::ValuesIn(::tinygpt::conformance::kv_cache_cases(#Name, __VA_ARGS__)),     \
                           ::tinygpt::conformance::kv_cache_case_name)

#define TINYGPT_REGISTERED_CACHE_CONFORMANCE(Name, registered)                                                \
  [[maybe_unused]] static const bool tinygpt_kv_cache_suite_##Name =                                            \
      ::tinygpt::conformance::kv_cache_suite_linked(TINYGPT_INSTALLED_DATA_DIR);                                \
  using ::tinygpt::conformance::KVCacheConformance;                                                             \
  INSTANTIATE_TEST_SUITE_P(Name, KVCacheConformance,                                                            \
                           ::testing::ValuesIn(::tinygpt::conformance::registered_cache_cases(registered)),     \
                           ::tinygpt::conformance::kv_cache_case_name)
