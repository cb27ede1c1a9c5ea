// .pt reader: LibTorch's zip reader, then our restricted unpickler and the checkpoint structure.
#include "fuzz_input.h"
#include "tinygpt/torch_checkpoint.h"
#include "tinygpt/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tinygpt::fuzz::write_input(data, size);
  tinygpt::fuzz::expect_clean([&] { tinygpt::read_torch_checkpoint(path); });
  return 0;
}
