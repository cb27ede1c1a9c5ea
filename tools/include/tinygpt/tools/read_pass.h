// How fast this machine streams memory, for the bench's bound: one read of a contiguous float32 CPU
// tensor, split over the intra-op threads, returning its sum (so the read cannot be optimised away).
// Compiled with OpenMP on its own: at::parallel_for is a header template, and its `#pragma omp
// parallel` only splits work in files compiled with OpenMP.
#pragma once

#include <ATen/core/Tensor.h>

namespace tinygpt::tools {

float read_pass(const at::Tensor& buf);

}  // namespace tinygpt::tools
