#include "tinygpt/huge_pages.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace tinygpt {

at::Tensor huge_page_floats(int64_t n) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t want = static_cast<size_t>(n) * sizeof(float);
  if (want < kHuge) {
    // Under one huge page (a test's small model, a short cache) a huge page would only waste
    // memory and the time to zero it: 64-byte aligned ordinary memory.
    void* block = std::aligned_alloc(64, std::max<size_t>(64, (want + 63) / 64 * 64));
    if (!block) throw std::bad_alloc();
    return at::from_blob(block, {n}, [](void* p) { std::free(p); }, at::TensorOptions().dtype(at::kFloat));
  }
  const size_t bytes = (want + kHuge - 1) / kHuge * kHuge;
  void* block = std::aligned_alloc(kHuge, bytes);
  if (!block) throw std::bad_alloc();
#ifdef __linux__
  madvise(block, bytes, MADV_HUGEPAGE);  // a hint: refused, the pages are ordinary ones
#endif
  return at::from_blob(block, {n}, [](void* p) { std::free(p); }, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace tinygpt
