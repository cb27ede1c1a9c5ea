#include "tinygpt/atomic_file.h"
#include "tinygpt/errors.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace tinygpt {

namespace {
// Flush a file's (or a folder's) data to the disk. A kill alone never needs it (the rename is
// atomic in the page cache); a power cut after the rename could otherwise leave an empty file.
void sync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}
// A process killed mid-write leaves PATH.tmp.PID behind. Before writing PATH, remove those whose
// process is gone (kill(pid, 0) says ESRCH), so kills do not pile up half-written files; a live
// writer's file is left alone.
void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}
}  // namespace

void write_atomically_via(const std::string& path, const std::function<void(const std::string&)>& fill) {
  remove_stale_temporaries(path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    fill(tmp);
    sync_path(tmp, O_RDONLY);
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
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  sync_path(parent.empty() ? std::string(".") : parent.string(), O_RDONLY | O_DIRECTORY);
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

void write_text_atomically(const std::string& path, const std::string& text) {
  write_atomically(path, [&](std::ostream& out) { out << text; });
}

}  // namespace tinygpt
