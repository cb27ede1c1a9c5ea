#include "tinygpt/checks/parallel_runs.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace tinygpt::checks {

int default_workers(c10::Device dev) { return dev.is_cuda() ? 1 : std::max(1, at::get_num_threads()); }

void run_in_parallel(size_t n, int workers, const std::function<void(size_t)>& job) {
  if (workers < 1) throw std::invalid_argument("run_in_parallel: workers must be >= 1");
  if (workers == 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) job(i);
    return;
  }
  workers = static_cast<int>(std::min<size_t>(static_cast<size_t>(workers), n));
  const int before = at::get_num_threads();
  const int each = std::max(1, before / workers);
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      // This thread's OpenMP team size; LibTorch also keeps it as the default of threads it
      // meets later, which the restore below puts back.
      at::set_num_threads(each);
      at::NoGradGuard no_grad;
      for (size_t i = next++; i < n; i = next++) {
        try {
          job(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
          next = n;
        }
      }
    });
  for (auto& t : pool) t.join();
  at::set_num_threads(before);
  if (error) std::rethrow_exception(error);
}

}  // namespace tinygpt::checks
