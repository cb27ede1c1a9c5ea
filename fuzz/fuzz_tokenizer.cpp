// tokenizer.json loading, then encoding and decoding a fixed text with whatever loaded.
#include "fuzz_input.h"
#include "tinygpt/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tinygpt::fuzz::write_input(data, size);
  tinygpt::fuzz::expect_clean([&] {
    const tinygpt::Tokenizer tok = tinygpt::Tokenizer::load(path);
    const auto ids = tok.encode("In the beginning God created the heaven and the earth. 123 \xc3\xa9\xf0\x9f\x98\x80 \n\n");
    tok.decode(ids);
  });
  return 0;
}
