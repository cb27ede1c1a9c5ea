// Float32 CPU buffers in transparent huge pages. A batch-1 decode step streams every weight (23 MB
// for the fixture) and every cached key and value it attends to; in 4-KiB pages that is thousands
// of TLB entries a step (Zen 4's second-level TLB holds 3,072), in 2-MiB pages a dozen. The model
// and the static cache keep theirs there; the bench reads its bound's buffer from there too.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tinygpt {

// n floats (uninitialised) starting on a 2-MiB boundary, the allocation rounded up to whole 2-MiB
// pages and marked MADV_HUGEPAGE (on Linux; elsewhere, or when the kernel declines, ordinary pages);
// under 2 MiB, ordinary 64-byte aligned memory. Freed when the last tensor viewing it goes. Throws
// std::bad_alloc.
at::Tensor huge_page_floats(int64_t n);

}  // namespace tinygpt
