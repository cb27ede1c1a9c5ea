// Tests that run once per kernel path (kernels.h: portable, AVX2/FMA), so one machine tests every
// path it can execute; a path this CPU cannot run is skipped, saying so. A fixture of a suite
// derives from OnEveryKernelPath and the file ends with TINYGPT_ON_EVERY_KERNEL_PATH(Suite).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tinygpt/kernels.h"

namespace tinygpt {

class OnEveryKernelPath : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    const auto available = kernel_paths_available();
    if (std::find(available.begin(), available.end(), GetParam()) == available.end())
      GTEST_SKIP() << "this CPU cannot run the " << to_string(GetParam()) << " kernel path";
    set_kernel_path(GetParam());
  }
  void TearDown() override { set_kernel_path(saved_); }

 private:
  KernelPath saved_ = kernel_path();
};

inline std::string kernel_path_name(const ::testing::TestParamInfo<KernelPath>& info) { return to_string(info.param); }

}  // namespace tinygpt

#define TINYGPT_ON_EVERY_KERNEL_PATH(Suite)                                                                   \
  INSTANTIATE_TEST_SUITE_P(Paths, Suite, ::testing::Values(::tinygpt::KernelPath::Portable, ::tinygpt::KernelPath::Avx2), \
                           ::tinygpt::kernel_path_name)
