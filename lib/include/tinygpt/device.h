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

// Sets LibTorch's intra-op threads; n must be >= 1 (throws std::invalid_argument otherwise).
void set_threads(int n);

}  // namespace tinygpt
