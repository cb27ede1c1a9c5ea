// The conform protocol reader: one engine answer line, as `tinygpt conform` parses it, then every
// decoder of an answer's contents (protocols 1 to 3: logits, rows, a forked row, sampled ids,
// threads' count, hello's fields, generate's results) on it, and the sanitizer every engine text goes through: its output
// is valid UTF-8 without control characters, within its bound, whatever the line held.
#include <cstdlib>
#include <string>

#include "engine_process.h"
#include "remote_target.h"

namespace {

// engine_text's promise: well-formed UTF-8, no control character but tab, at most max + 3 bytes.
void expect_safe(const std::string& s, size_t max) {
  const std::string t = tinygpt::checks::engine_text(s, max);
  if (t.size() > max + 3) std::abort();
  for (size_t i = 0; i < t.size();) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > t.size()) std::abort();
    if (n == 1 && ((c < 0x20 && c != '\t') || c == 0x7f)) std::abort();
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(t[i + k]) >> 6) != 2) std::abort();
    i += n;
  }
}

template <typename F>
void judged(F f) {
  try {
    f();
  } catch (const tinygpt::checks::WrongAnswer&) {  // a wrong answer: the check fails, saying why
  } catch (const tinygpt::checks::EngineUnusable&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tinygpt::checks;
  const std::string line(reinterpret_cast<const char*>(data), size);
  expect_safe(line, 200);
  expect_safe(line, 7);
  nlohmann::json a;
  try {
    a = parse_response(line, "step");
  } catch (const EngineUnusable&) {
    return 0;
  }
  // Shapes from the first byte, so the corpus reaches each decoder's checks: 1-2 rows of 4-7 logits.
  const int64_t rows = 1 + (size ? data[0] & 1 : 0), vocab = 4 + (size ? (data[0] >> 1) & 3 : 0);
  judged([&] { answer_logits(a, rows, vocab, "step"); });
  judged([&] { answer_rows(a, static_cast<size_t>(rows)); });
  judged([&] { answer_row(a, "fork"); });
  judged([&] { answer_before(a); });
  judged([&] { answer_sample_ids(a, static_cast<size_t>(rows), 1 + (size > 1 ? data[1] & 3 : 0), vocab); });
  judged([&] { check_hello(a); });
  // generate's results: two requests (ids 0 and 3, the second with two copies) of 1-2 tokens each.
  std::vector<ServedRequest> asked(2);
  asked[0].id = 0, asked[0].prompt = {1, 2}, asked[0].n = rows;
  asked[1].id = 3, asked[1].prompt = {4}, asked[1].n = 1, asked[1].after_finished = {0}, asked[1].copies = 2;
  judged([&] { answer_served(a, asked, vocab); });
  return 0;
}
