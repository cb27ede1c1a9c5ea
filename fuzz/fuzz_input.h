// The fuzz input as a file (the loaders take paths, as the command line gives them), and the rule
// every target checks: a loader either returns or throws a std::exception; anything else (a crash,
// a sanitizer report, an abort, another exception type) is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace tinygpt::fuzz {

inline std::string write_input(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/tinygpt-fuzz-" + std::to_string(getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

template <typename F>
void expect_clean(F body) {
  try {
    body();
  } catch (const std::exception&) {  // a clear refusal: fine
  }
}

}  // namespace tinygpt::fuzz
