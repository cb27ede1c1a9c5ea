#include "tinygpt/device.h"

#include <ATen/Parallel.h>
#include <sched.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace tinygpt {

c10::Device parse_device(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name.rfind("cuda", 0) != 0)
    throw std::invalid_argument("unknown device '" + name + "' (expected cpu, cuda or cuda:N)");
  c10::Device dev(c10::kCPU);
  try {
    dev = c10::Device(name);
  } catch (const std::exception&) {
    throw std::invalid_argument("unknown device '" + name + "' (expected cpu, cuda or cuda:N)");
  }
  if (!torch::cuda::is_available())
    throw std::runtime_error("device '" + name + "' requested but this LibTorch has no usable CUDA");
  if (dev.has_index() && dev.index() >= static_cast<int>(torch::cuda::device_count()))
    throw std::runtime_error("device '" + name + "' requested but only " +
                             std::to_string(torch::cuda::device_count()) + " CUDA device(s) exist");
  return dev;
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned h = std::thread::hardware_concurrency();
  return h > 0 ? static_cast<int>(h) : 1;
}

std::string libtorch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

void set_threads(int n) {
  if (n < 1) throw std::invalid_argument("threads must be >= 1, got " + std::to_string(n));
  at::set_num_threads(n);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown";
}

}  // namespace tinygpt
