// Device and thread selection shared by every entry point.
#pragma once

#include <c10/core/Device.h>
#include <string>

namespace tinygpt {

// "cpu", "cuda" or "cuda:N" -> a device this LibTorch can use. Throws std::invalid_argument
// for an unknown name and std::runtime_error when CUDA is asked for but unavailable.
c10::Device parse_device(const std::string& name);

// Cores this process may run on (the affinity mask), at least 1.
int available_cores();

// LibTorch's version as its headers state it ("1.13.0" for Debian's 1.13.1 package), for provenance.
std::string libtorch_version();

// The CPU model from /proc/cpuinfo, or "unknown" (provenance: BLAS kernels round differently by CPU).
std::string cpu_model();

// Sets LibTorch's intra-op threads; n must be >= 1 (throws std::invalid_argument otherwise).
void set_threads(int n);

}  // namespace tinygpt
