// GGUF reader: magic, version, counts, metadata of every value type, tensor infos, alignment and
// offsets from hostile bytes.
#include "fuzz_input.h"
#include "tinygpt/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tinygpt::fuzz::write_input(data, size);
  tinygpt::fuzz::expect_clean([&] { tinygpt::read_gguf(path); });
  return 0;
}
