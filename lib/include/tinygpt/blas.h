// Which BLAS LibTorch's products run on, and which of its kernels. OpenBLAS picks its kernels (its
// "core") when it loads, from the CPU it finds; an OpenBLAS older than the CPU does not know it and
// falls back to its oldest x86-64 kernels (Debian 12's 0.3.21 picks Prescott, SSE3, on newer Intel
// CPUs), whose products are slower and whose sums change with how the threads split the work. The
// command line reads this at start and, where the core is older than the CPU, runs with the core
// that matches it (cli/runtime.cpp); every report names the core it ran on.
#pragma once

#include <string>

namespace tinygpt {

// What the CPU can execute, as the kernels and OpenBLAS's cores need it (CPUID, with the OS's
// support for the vector state).
struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  bool sse3 = false, ssse3 = false, sse4_2 = false, avx = false, avx2 = false, fma = false;
  bool avx512 = false;  // F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels need
  std::string to_string() const;  // "AVX2, FMA" (the widest it has)
};
CpuFeatures cpu_features();

struct BlasInfo {
  std::string library;  // "OpenBLAS 0.3.21" (from openblas_get_config), or "not OpenBLAS ..."
  std::string core;     // the kernels OpenBLAS runs (openblas_get_corename), "" when not OpenBLAS
  // Who chose the core: "OpenBLAS", "OPENBLAS_CORETYPE" (set by the user) or tinygpt's note saying
  // what OpenBLAS had chosen and why it was replaced (the environment's TINYGPT_BLAS_NOTE).
  std::string chosen_by;
  std::string to_string() const;  // "OpenBLAS 0.3.21, core Haswell (chosen by ...)"
};
// The BLAS loaded in this process, read through OpenBLAS's own symbols when they are there.
BlasInfo blas_info();

// The OpenBLAS core for `cpu` when `chosen` is an older kind of kernel than the CPU can run
// (Prescott on an AVX2 CPU); "" when `chosen` fits the CPU or is not a core this knows.
std::string better_blas_core(const std::string& chosen, const CpuFeatures& cpu);

// Whether `core` names an x86-64 OpenBLAS core (any case) whose kernels `cpu` can execute.
bool blas_core_runs_on(const std::string& core, const CpuFeatures& cpu);

}  // namespace tinygpt
