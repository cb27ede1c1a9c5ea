// Rotary position embedding with a start position (SPEC 2), computed in float32.
// Leaves out caching of the angle table: at this size recomputing it is cheaper than a lookup.
#pragma once

#include <ATen/core/Tensor.h>
#include <cstdint>

namespace tinygpt {

// x: (..., T, hd) with hd even, any floating dtype. Rotates channel pairs (2j, 2j+1)
// of row t by angle (start + t) * 10000^(-2j/hd). Returns a tensor of x's shape and dtype.
at::Tensor rope(const at::Tensor& x, int64_t start);

}  // namespace tinygpt
