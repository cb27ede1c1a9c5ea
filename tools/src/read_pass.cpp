#include "tinygpt/tools/read_pass.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace tinygpt::tools {

float read_pass(const at::Tensor& buf) {
  if (!buf.defined() || buf.scalar_type() != at::kFloat || !buf.device().is_cpu() || !buf.is_contiguous())
    throw std::invalid_argument("read_pass: needs a contiguous float32 CPU tensor");
  constexpr int64_t kChunk = 1 << 14;  // floats a task sums
  const float* p = buf.data_ptr<float>();
  const int64_t n = buf.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> partial(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      // Eight independent 4-float sums (GCC's vector extension: one SSE register each on any
      // x86-64), so the additions overlap and the loads, not the adds, set the pace.
      typedef float v4 __attribute__((vector_size(16)));
      v4 acc[8] = {};
      const float* q = p + c * kChunk;
      const int64_t len = std::min(kChunk, n - c * kChunk);
      int64_t k = 0;
      for (; k + 32 <= len; k += 32) {
        // The two lines 16 KiB ahead, as the decode products prefetch their weights (kernels.cpp):
        // a bound must read at least as well as the code it bounds.
        __builtin_prefetch(q + k + 4096);
        __builtin_prefetch(q + k + 4096 + 16);
        for (int j = 0; j < 8; ++j) {
          v4 x;
          std::memcpy(&x, q + k + 4 * j, sizeof x);
          acc[j] += x;
        }
      }
      float sum = 0;
      for (const v4& v : acc) sum += v[0] + v[1] + v[2] + v[3];
      for (; k < len; ++k) sum += q[k];
      partial[static_cast<size_t>(c)] = sum;
    }
  });
  float total = 0;
  for (float v : partial) total += v;
  return total;
}

}  // namespace tinygpt::tools
