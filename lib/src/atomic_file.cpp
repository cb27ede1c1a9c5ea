#include "tinygpt/atomic_file.h"
#include "tinygpt/errors.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace tinygpt {

void write_atomically_via(const std::string& path, const std::function<void(const std::string&)>& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    fill(tmp);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw InputError(path + ": cannot move the written file into place");
  }
}

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& body) {
  write_atomically_via(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw InputError(path + ": cannot create " + tmp);
    body(out);
    out.flush();
    if (!out) throw std::runtime_error(path + ": write failed (disk full?)");
  });
}

}  // namespace tinygpt
