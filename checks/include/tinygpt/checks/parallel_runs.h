// Independent check runs (a fault, a cache, a golden comparison) spread over threads. A batch-1
// decode step gains less from a second intra-op thread than a second run does (docs/perf.md
// measures it), so each run gets one thread and the runs share the cores.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <functional>

namespace tinygpt::checks {

// Workers for runs on `dev`: one per intra-op thread on the CPU, 1 on CUDA (one device, one
// stream: runs there would only queue behind each other).
int default_workers(c10::Device dev);

// Calls job(0) .. job(n - 1), `workers` at a time, each worker taking the next index, on its own
// thread with max(1, intra-op threads / workers) intra-op threads and gradients off. With one
// worker (or one job) everything runs on the calling thread, with its threads. A job's exception
// stops the others taking new jobs and is rethrown here after they finish; the calling thread's
// intra-op thread count is restored. Jobs must not share mutable state (each its own cache and
// generators); the global generator is not for them.
void run_in_parallel(size_t n, int workers, const std::function<void(size_t)>& job);

}  // namespace tinygpt::checks
