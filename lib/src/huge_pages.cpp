#include "tinygpt/huge_pages.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <new>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace tinygpt {

at::Tensor huge_page_floats(int64_t n) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + kHuge - 1) / kHuge * kHuge;
  void* block = std::aligned_alloc(kHuge, bytes == 0 ? kHuge : bytes);
  if (!block) throw std::bad_alloc();
#ifdef __linux__
  madvise(block, bytes, MADV_HUGEPAGE);  // a hint: refused, the pages are ordinary ones
#endif
  return at::from_blob(block, {n}, [](void* p) { std::free(p); }, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace tinygpt
