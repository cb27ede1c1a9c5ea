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
  // Under one huge page (a test's small model, a short cache) a huge page would only waste memory
  // and the time to zero it: 64-byte aligned ordinary memory.
  const bool huge = want >= kHuge;
  const size_t align = huge ? kHuge : 64;
  const size_t bytes = (std::max<size_t>(want, 1) + align - 1) / align * align;
  void* block = std::aligned_alloc(align, bytes);
  if (!block) throw std::bad_alloc();
#ifdef __linux__
  if (huge) madvise(block, bytes, MADV_HUGEPAGE);  // a hint: refused, the pages are ordinary ones
#endif
  return at::from_blob(block, {n}, [](void* p) { std::free(p); }, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace tinygpt
