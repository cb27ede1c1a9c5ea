// The tokenizer (SPEC 8): round trips, merge validation, and agreement with an independent
// Python implementation (python3-regex) on tricky strings and invalid UTF-8.
#include <gtest/gtest.h>

#include "paths.h"
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tinygpt/tokenizer.h"

namespace tinygpt {
namespace {

namespace fs = std::filesystem;

const char* kCorpus =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. It's 1611, they'll say; we've 42 days, you're sure? "
    "Don't stop!!! ... Café naïve résumé — 東京 北京 ☃ 😀 tabs\tand\nnewlines\n\n   spaces   end. ";

const std::vector<std::string> kTricky = {
    "it's they'll we've you're I'm don't he'd",  "1611 and 42, 3.14159 and ١٢٣",
    "Wait!!! What?!... (yes) [no] {maybe}",         "   leading and trailing   ",
    "tabs\t\tand\nnew\n\nlines\r\n",                "Café naïve résumé Ångström",
    "東京 北京 한국어 日本語",                       "emoji 😀👍🏽 and ☃ snowman",
    "MIXED case CamelCase snake_case",              "a",
    "'s's 'S",                                      "",
};

std::string corpus() {
  std::string s;
  for (int i = 0; i < 20; ++i) s += kCorpus;
  return s;
}

TEST(Tokenizer, RoundTripsText) {
  Tokenizer t = Tokenizer::train(corpus(), 400);
  EXPECT_EQ(t.vocab_size(), 400);
  for (const auto& s : kTricky) EXPECT_EQ(t.decode(t.encode(s)), s);
  // Merges shorten the encoding of text like the corpus.
  EXPECT_LT(t.encode(kCorpus).size(), std::string(kCorpus).size() / 2);
}

TEST(Tokenizer, SplitFollowsTheSeriesRegex) {
  EXPECT_EQ(Tokenizer::split("Hello world's 42!!  x"),
            (std::vector<std::string>{"Hello", " world", "'s", " 42", "!!", " ", " x"}));
}

TEST(Tokenizer, RefusesMergesThatReferToMissingIds) {
  EXPECT_THROW(Tokenizer({{1, 2}, {256, 300}}), std::invalid_argument);
  EXPECT_THROW(Tokenizer({{-1, 2}}), std::invalid_argument);
  EXPECT_NO_THROW(Tokenizer({{1, 2}, {256, 256}}));
}

TEST(Tokenizer, RefusesBadIdsAndInvalidUtf8Input) {
  Tokenizer t({});
  EXPECT_THROW(t.decode({256}), std::invalid_argument);
  EXPECT_THROW(t.encode("bad \xff byte"), std::invalid_argument);
}

TEST(Tokenizer, SavesAndLoadsAtomically) {
  Tokenizer t = Tokenizer::train(corpus(), 300);
  const auto path = fs::temp_directory_path() / "tinygpt_tok_test.json";
  t.save(path.string());
  Tokenizer u = Tokenizer::load(path.string());
  EXPECT_EQ(u.merges(), t.merges());
  std::ofstream(path) << "{\"merges\": [[1, 2], [999, 3]]}";
  EXPECT_THROW(Tokenizer::load(path.string()), std::runtime_error);
  std::ofstream(path) << "not json";
  EXPECT_THROW(Tokenizer::load(path.string()), std::runtime_error);
}

TEST(Tokenizer, ReplacesInvalidUtf8LikePython) {
  // Each maximal invalid subpart becomes one U+FFFD.
  EXPECT_EQ(Tokenizer::utf8_replace("a\xff" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(Tokenizer::utf8_replace("\xE2\x82"), "\xEF\xBF\xBD");            // truncated 3-byte
  EXPECT_EQ(Tokenizer::utf8_replace("\xE2\x82x"), "\xEF\xBF\xBDx");
  EXPECT_EQ(Tokenizer::utf8_replace("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(Tokenizer::utf8_replace("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

// Agreement with python3-regex: same split, same merge rule, same ids; same U+FFFD decoding.
TEST(TokenizerInterop, MatchesThePythonImplementation) {
  const fs::path dir = fs::path(TINYGPT_BINARY_DIR) / "interop";
  fs::create_directories(dir);
  Tokenizer t = Tokenizer::train(corpus(), 600);
  t.save((dir / "tok.json").string());
  const std::vector<std::vector<int>> bytes = {
      {0x61, 0xff, 0x62}, {0xe2, 0x82}, {0xe2, 0x82, 0x78}, {0xc0, 0xaf}, {0xed, 0xa0, 0x80},
      {0xf0, 0x9f, 0x98}, {0xf4, 0x90, 0x80, 0x80}, {0xf0, 0x9f, 0x98, 0x80, 0x80}, {0x80, 0x80, 0x41}};
  nlohmann::json cases = {{"texts", kTricky}, {"byte_seqs", bytes}};
  std::ofstream(dir / "tok_cases.json") << cases.dump();
  const std::string cmd = "/usr/bin/python3 " + std::string(TINYGPT_SOURCE_DIR) + "/tests/interop/tokenizer_reference.py " +
                          (dir / "tok.json").string() + " " + (dir / "tok_cases.json").string() + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  if (pclose(f) != 0) GTEST_SKIP() << "python3-regex not available (install it with ci/install.sh)";
  auto theirs = nlohmann::json::parse(out);
  for (size_t i = 0; i < kTricky.size(); ++i)
    EXPECT_EQ(t.encode(kTricky[i]), theirs["ids"][i].get<std::vector<int64_t>>()) << "text: " << kTricky[i];
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string raw(bytes[i].begin(), bytes[i].end());
    EXPECT_EQ(Tokenizer::utf8_replace(raw), theirs["decoded"][i].get<std::string>()) << "case " << i;
  }
}

}  // namespace
}  // namespace tinygpt
