// The KV-cache conformance suite: a cache of yours through every check tinygpt runs on its own, on
// the shipped fixture and on untrained weights, on CPU and CUDA. In a test binary linking
// tinygpt::conformance and GTest::gtest_main, one line:
//
//   TINYGPT_KV_CACHE_CONFORMANCE(MyCache, [](const tinygpt::Config& c) { return std::make_unique<MyCache>(c); });
//
// Tests, named MyCache/KVCacheConformance.<test>/<fixture|untrained>_<cpu|cuda>:
//   <check>  one per row of the check table our own caches run (`tinygpt checks` lists them; a
//            name's dashes become underscores: window_reference, join_leave), over greedy decoding
//            from ids [1, 2, 3] to 64 tokens past the window; the rows of one case share its main run, so
//            `--gtest_filter='*.window_reference/*'` runs one check and costs that check alone
//   LengthAndBytesFollowTheFormula  length() = min(tokens, context); bytes() = 2 x layers x batch x
//            length x d_model x 4 (float32); capacity_bytes() >= bytes(); reset() empties it
// A failure prints the row as `tinygpt equivalence` prints it: the check, the first position over
// the bound, the logit difference and the top-2 margin there. Include this header in one file.
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

// The fixture of every test of the suite; each test is one case and one check (or the formula test).
class KVCacheConformance : public ::testing::Test {
 public:
  explicit KVCacheConformance(CacheCase c) : case_(std::move(c)) {}

 protected:
  // Why the case cannot run here (no CUDA device, a registered name this build lacks), or "".
  std::string skip_reason() const;
  CacheCase case_;
};

// The cache on {fixture, untrained} x {cpu, cuda}.
std::vector<CacheCase> kv_cache_cases(const std::string& name, const checks::CacheFactory& factory,
                                      Kernels kernels = Kernels::Library);
// A cache of tinygpt's registry by name (its factory, kernels and step function as registered); its
// cases skip, saying so, where the name is not registered (cuda-graph registers only with CUDA).
std::vector<CacheCase> registered_cache_cases(const std::string& registered);
// "fixture_cpu", "untrained_cuda".
std::string kv_cache_case_name(const CacheCase& c);
// The checks the suite runs as tests, one per row: every model check but the engine-only ones.
std::vector<std::string> kv_cache_suite_checks();
// Registers every test of the suite for `cases` under the suite name "<name>/KVCacheConformance";
// also points the suite at the installed package's data folder when the package recorded one.
bool register_kv_cache_suite(const std::string& name, const std::vector<CacheCase>& cases, const char* data_dir);

}  // namespace tinygpt::conformance

#ifndef TINYGPT_INSTALLED_DATA_DIR
#define TINYGPT_INSTALLED_DATA_DIR ""
#endif

// Optional third argument: the tinygpt::Kernels its decode steps use (default Kernels::Library).
// TINYGPT_REGISTERED_CACHE_CONFORMANCE(Name, "static") runs the kit on a cache of tinygpt's registry.
#define TINYGPT_KV_CACHE_CONFORMANCE(Name, ...)                                                                \
  [[maybe_unused]] static const bool tinygpt_kv_cache_suite_##Name = ::tinygpt::conformance::register_kv_cache_suite( \
      #Name, ::tinygpt::conformance::kv_cache_cases(#Name, __VA_ARGS__), TINYGPT_INSTALLED_DATA_DIR)

#define TINYGPT_REGISTERED_CACHE_CONFORMANCE(Name, registered)                                                 \
  [[maybe_unused]] static const bool tinygpt_kv_cache_suite_##Name = ::tinygpt::conformance::register_kv_cache_suite( \
      #Name, ::tinygpt::conformance::registered_cache_cases(registered), TINYGPT_INSTALLED_DATA_DIR)
