// The atomic writer: a failed write keeps the old file and leaves no temporary; temporaries of
// killed writers are cleared by the next write, those of live writers kept.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "tinygpt/atomic_file.h"

namespace tinygpt {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("tinygpt-atomic-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

int count_temporaries(const fs::path& d) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(d)) n += e.path().filename().string().find(".tmp.") != std::string::npos;
  return n;
}

TEST(AtomicFile, AFailedWriteKeepsTheOldFileAndLeavesNoTemporary) {
  const fs::path d = fresh_dir("fail"), f = d / "out.json";
  write_atomically(f.string(), [](std::ostream& o) { o << "old"; });
  EXPECT_THROW(write_atomically(f.string(),
                                [](std::ostream& o) {
                                  o << "half of the new";
                                  throw std::runtime_error("disk full");
                                }),
               std::runtime_error);
  EXPECT_EQ(slurp(f), "old");
  EXPECT_EQ(count_temporaries(d), 0);
  write_atomically(f.string(), [](std::ostream& o) { o << "new"; });
  EXPECT_EQ(slurp(f), "new");
  fs::remove_all(d);
}

TEST(AtomicFile, TemporariesOfDeadWritersAreRemovedAndLiveOnesKept) {
  const fs::path d = fresh_dir("stale"), f = d / "golden.json";
  const fs::path dead = d / "golden.json.tmp.999999999";  // above Linux's pid_max (4194304): no such process
  const fs::path live = d / ("golden.json.tmp." + std::to_string(::getppid()));
  const fs::path other = d / "other.json.tmp.999999999";  // another target's: not ours to judge here
  for (const auto& p : {dead, live, other}) std::ofstream(p) << "torn";
  write_atomically(f.string(), [](std::ostream& o) { o << "new"; });
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_EQ(slurp(f), "new");
  fs::remove_all(d);
}

}  // namespace
}  // namespace tinygpt
