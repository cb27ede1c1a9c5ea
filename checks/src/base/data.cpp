#include "tinygpt/checks/data.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "paths.h"
#include "tinygpt/checks/results.h"

namespace tinygpt::checks {

namespace fs = std::filesystem;

namespace {
std::mutex mu;
std::string& hint() {
  static std::string h;
  return h;
}
}  // namespace

void set_data_dir_hint(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu);
  hint() = dir;
}

std::string data_dir() {
  std::vector<std::string> tried;
  if (const char* env = std::getenv("TINYGPT_DATA_DIR")) tried.push_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back((exe.parent_path().parent_path() / "share" / "tinygpt" / "golden").string());
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!hint().empty()) tried.push_back(hint());
  }
  tried.push_back(TINYGPT_GOLDEN_DIR);
  for (const auto& d : tried)
    if (fs::exists(fs::path(d) / "fixture.safetensors", ec)) return d;
  throw std::runtime_error("the shipped fixture is not in any of: " + join(tried) +
                           " (set TINYGPT_DATA_DIR to the folder holding fixture.safetensors)");
}

std::string engines_dir() {
  std::vector<std::string> tried;
  if (const char* env = std::getenv("TINYGPT_ENGINES_DIR")) tried.push_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back((exe.parent_path().parent_path() / "share" / "tinygpt" / "engines").string());
  tried.push_back(std::string(TINYGPT_SOURCE_DIR) + "/engines");
  for (const auto& d : tried)
    if (fs::exists(fs::path(d) / "onnxruntime" / "export_onnx.py", ec)) return d;
  throw std::runtime_error("the engine adapters are not in any of: " + join(tried) + " (set TINYGPT_ENGINES_DIR)");
}

}  // namespace tinygpt::checks
