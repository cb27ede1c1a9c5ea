// Golden files, the recorded side: the reader and the comparison with a fresh computation. The
// fresh documents are the shipped goldens (what computing the fixture gives, trusted), with the
// shipped tokenizer; the fuzzer writes the recorded file, which is the user's.
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "fuzz_input.h"
#include "tinygpt/checks/golden_compare.h"

namespace {

struct Shipped {
  tinygpt::Tokenizer tok = tinygpt::Tokenizer::load(TINYGPT_GOLDEN_DIR "/tokenizer.json");
  std::vector<nlohmann::json> fresh;
  Shipped() {
    for (const char* f : {"greedy_600.json", "sample_grid.json", "sampler_selfcheck.json"})
      fresh.push_back(tinygpt::checks::read_golden_json(std::string(TINYGPT_GOLDEN_DIR) + "/" + f));
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Shipped shipped;
  const std::string path = tinygpt::fuzz::write_input(data, size);
  tinygpt::fuzz::expect_clean([&] {
    const nlohmann::json want = tinygpt::checks::read_golden_json(path);
    tinygpt::checks::validate_golden_document(path, want, shipped.tok);
    for (const auto& fresh : shipped.fresh)
      for (bool cached_only : {false, true})
        for (const auto& r : tinygpt::checks::compare_golden_document(path, want, fresh, shipped.tok, "", cached_only))
          (void)r.detail.size();
  });
  return 0;
}
