// parse_json_fast against nlohmann::json::parse, the reader it stands in for: the same value (types
// included: unsigned, signed and float numbers stay apart) for every text nlohmann reads, and a
// refusal for every text it refuses - on hand-picked edges, on generated documents written in many
// spellings, and on those documents with bytes changed at random.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine_process.h"

namespace tinygpt::checks {
namespace {

using nlohmann::json;

// Equal values of equal types, all the way down (json's == calls 1 and 1u and 1.0 equal).
::testing::AssertionResult same(const json& a, const json& b, const std::string& at = "$") {
  if (a.type() != b.type())
    return ::testing::AssertionFailure() << at << ": " << a.type_name() << " " << a.dump() << " vs " << b.type_name() << " " << b.dump();
  if (a.is_object()) {
    if (a.size() != b.size()) return ::testing::AssertionFailure() << at << ": " << a.size() << " keys vs " << b.size();
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (!b.contains(it.key())) return ::testing::AssertionFailure() << at << ": no key " << it.key();
      if (auto r = same(it.value(), b.at(it.key()), at + "." + it.key()); !r) return r;
    }
    return ::testing::AssertionSuccess();
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return ::testing::AssertionFailure() << at << ": " << a.size() << " items vs " << b.size();
    for (size_t i = 0; i < a.size(); ++i)
      if (auto r = same(a[i], b[i], at + "[" + std::to_string(i) + "]"); !r) return r;
    return ::testing::AssertionSuccess();
  }
  if (a.is_number_float()) {  // bit for bit (a NaN never parses)
    const double x = a.get<double>(), y = b.get<double>();
    if (std::memcmp(&x, &y, sizeof x) != 0) return ::testing::AssertionFailure() << at << ": " << a.dump() << " vs " << b.dump();
    return ::testing::AssertionSuccess();
  }
  if (a != b) return ::testing::AssertionFailure() << at << ": " << a.dump() << " vs " << b.dump();
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult reads_as_nlohmann(const std::string& text) {
  const json want = json::parse(text, nullptr, /*allow_exceptions=*/false);
  const json got = parse_json_fast(text);
  if (want.is_discarded() != got.is_discarded())
    return ::testing::AssertionFailure() << "'" << text << "': nlohmann " << (want.is_discarded() ? "refuses" : "reads") << " it, the fast reader "
                                         << (got.is_discarded() ? "refuses" : "reads") << " it";
  if (want.is_discarded()) return ::testing::AssertionSuccess();
  if (auto r = same(want, got); !r) return r << " in '" << text << "'";
  return ::testing::AssertionSuccess();
}

TEST(FastJson, EdgesReadAsNlohmannReadsThem) {
  const std::vector<std::string> texts = {
      // numbers: integers (unsigned, signed, past 64 bits), fractions, exponents, under- and overflow
      "0", "-0", "7", "-7", "18446744073709551615", "18446744073709551616", "-9223372036854775808", "-9223372036854775809",
      "0.5", "-0.0", "1e5", "1E+5", "1e-5", "2.5e-3", "1e308", "1e309", "-1e309", "1e-400", "4.9e-324", "2.2250738585072011e-308",
      "0.1000000000000000055511151231257827", "3.4028234663852886e38", "123456789012345678901234567890",
      "01", "1.", ".5", "+1", "-", "1e", "1e+", "--1", "0x10", "NaN", "Infinity", "-Infinity", "1.5.2", "1e5e5",
      // literals and structure
      "true", "false", "null", "tru", "nul", "True", "[]", "{}", "[1,2,3]", "[1,]", "[,1]", "{\"a\":1,}", "{\"a\" 1}", "{1:2}",
      "[1 2]", "[1:2]", "{\"a\":1 \"b\":2}", "{\"a\":1:\"b\":2}", "{\"a\":1,\"a\":2}", " \t\r\n[ 1 , { \"b\" : [ ] } ] \n", "[1] x", "[1]]", "[[[[[[[]]]]]]]", "", " ", "\xEF\xBB\xBF[1]",
      // strings: escapes, unicode, control characters, bad UTF-8
      "\"\"", "\"plain ascii ~\"", "\"tab\\tnew\\nquote\\\"back\\\\slash\\/\"", "\"\\u00e9\\u4e2d\\ud83d\\ude00\"", "\"\\ud83d\"",
      "\"\\u12\"", "\"\\x41\"", "\"caf\xC3\xA9\"", "\"\xC3\"", "\"\xFF\xFE\"", "\"a\nb\"", "\"a\tb\"", "\"\x7F\"", "\"unterminated",
      "\"\\\"", "{\"ok\": true, \"logits\": [[0.25, -1.5e-7, 3], [1e2, -0, 2.0]], \"ids\": [1, 2]}",
  };
  for (const std::string& t : texts) EXPECT_TRUE(reads_as_nlohmann(t));
}

// A random document and a random way of writing it: nested objects and arrays, numbers of every
// kind, strings with escapes and multi-byte characters.
class Writer {
 public:
  explicit Writer(uint32_t seed) : rng_(seed) {}

  std::string document() { return value(0); }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  std::string space() {
    static const char* spaces[] = {"", "", "", " ", "\n", " \t", "\r\n  "};
    return spaces[pick(7)];
  }
  std::string number() {
    switch (pick(6)) {
      case 0: return std::to_string(std::uniform_int_distribution<int64_t>(-1000000, 1000000)(rng_));
      case 1: return std::to_string(std::uniform_int_distribution<uint64_t>()(rng_));
      case 2: {
        char b[64];
        std::snprintf(b, sizeof b, "%.17g", std::normal_distribution<double>(0, 5)(rng_));
        return b;
      }
      case 3: {
        char b[64];
        std::snprintf(b, sizeof b, "%.9g", static_cast<float>(std::normal_distribution<double>(0, 1e-3)(rng_)));
        return b;
      }
      case 4: {
        char b[64];
        std::snprintf(b, sizeof b, "%dE%+d", pick(100) - 50, pick(700) - 350);
        return b;
      }
      default: return std::to_string(pick(10)) + "." + std::to_string(pick(1000)) + (pick(2) ? "e-" + std::to_string(pick(30)) : "");
    }
  }
  std::string string() {
    static const char* parts[] = {"a", "logits", " ", "\\n", "\\\"", "\\\\", "\\/", "\\u00e9", "\\ud83d\\ude00", "\xC3\xA9", "\xE4\xB8\xAD", "~", "0"};
    std::string s = "\"";
    for (int i = pick(6); i > 0; --i) s += parts[pick(13)];
    return s + "\"";
  }
  std::string value(int depth) {
    const int kind = depth > 3 ? pick(4) : pick(6);
    switch (kind) {
      case 0: return number();
      case 1: return string();
      case 2: {
        static const char* words[] = {"true", "false", "null"};
        return words[pick(3)];
      }
      case 3: return number();
      case 4: {
        std::string s = "[" + space();
        for (int i = pick(5); i > 0; --i) s += value(depth + 1) + space() + (i > 1 ? "," + space() : "");
        return s + "]";
      }
      default: {
        std::string s = "{" + space();
        for (int i = pick(5); i > 0; --i) s += string() + space() + ":" + space() + value(depth + 1) + (i > 1 ? "," + space() : "");
        return s + "}";
      }
    }
  }
  std::mt19937 rng_;
};

TEST(FastJson, GeneratedDocumentsReadAsNlohmannReadsThem) {
  int read = 0;
  for (uint32_t seed = 0; seed < 3000; ++seed) {
    const std::string text = Writer(seed).document();
    ASSERT_TRUE(reads_as_nlohmann(text)) << "seed " << seed;
    read += !parse_json_fast(text).is_discarded();
  }
  EXPECT_GT(read, 2900);  // the generator writes valid JSON (the odd exponent overflows)
}

TEST(FastJson, ChangedBytesAreRefusedWhereNlohmannRefusesThem) {
  static const char bytes[] = "{}[],:\"\\0123456789.eE+-tfnul \n\x80\xC3\xFF";
  std::mt19937 rng(7);
  int refused = 0;
  for (uint32_t seed = 0; seed < 3000; ++seed) {
    std::string text = Writer(seed).document();
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0 && !text.empty(); --k) {
      const size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0: text[at] = bytes[rng() % (sizeof bytes - 1)]; break;
        case 1: text.erase(at, 1); break;
        default: text.insert(at, 1, bytes[rng() % (sizeof bytes - 1)]);
      }
    }
    ASSERT_TRUE(reads_as_nlohmann(text)) << "seed " << seed;
    refused += parse_json_fast(text).is_discarded();
  }
  EXPECT_GT(refused, 1000);  // the changes break most documents: both readers are asked to refuse
}

}  // namespace
}  // namespace tinygpt::checks
