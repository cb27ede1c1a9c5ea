// safetensors reader: header length, JSON header, offsets, dtypes and shapes from hostile bytes.
#include "fuzz_input.h"
#include "tinygpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tinygpt::fuzz::write_input(data, size);
  tinygpt::fuzz::expect_clean([&] { tinygpt::read_safetensors_checkpoint(path); });
  return 0;
}
