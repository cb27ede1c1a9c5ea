// A Hugging Face tokenizer.json (hf_tokenizer.h) without the tokenizers library: a small file whose ids
// follow from its merges by hand, the series' tokenizer through its own export to that format, and every
// part the reader does not cover refused by name. tests/tokenizer/ holds it against the library itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "paths.h"
#include "tinygpt/errors.h"
#include "tinygpt/hf_tokenizer.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// GPT-2's form: "Ġ" is the byte-level character of a space.
json small_byte_level() {
  return json::parse(R"({
    "added_tokens": [{"id": 5, "content": "<x>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4}, "merges": ["a b", ["Ġ", "ab"]]}
  })");
}

TEST(HfTokenizer, MergesByRankAndSplitsOnAddedTokens) {
  const HfTokenizer t(small_byte_level(), "small");
  EXPECT_EQ(t.encode("ab ab"), (std::vector<int64_t>{3, 4}));  // "ab", then " ab" -> "Ġab"
  EXPECT_EQ(t.encode("ba"), (std::vector<int64_t>{1, 0}));     // no merge "b a"
  EXPECT_EQ(t.encode("ab<x>ab"), (std::vector<int64_t>{3, 5, 3}));
  EXPECT_EQ(t.decode({3, 4}), "ab ab");
  EXPECT_EQ(t.decode({3, 5, 3}), "abab") << "special tokens are skipped, as the library's decode does by default";
  EXPECT_EQ(t.vocab_size(), 6);
  EXPECT_THROW(t.decode({6}), std::invalid_argument);
  EXPECT_THROW(t.encode("c"), std::invalid_argument) << "a character the vocabulary lacks, no byte fallback and no unk";
  EXPECT_THROW(t.encode(std::string("a\xff")), std::invalid_argument) << "invalid UTF-8";
}

TEST(HfTokenizer, ByteFallbackAndTheTemplate) {
  json d = json::parse(R"({
    "added_tokens": [{"id": 1, "content": "<s>", "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                                                 {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true,
              "vocab": {"<unk>": 0, "<s>": 1, "▁": 2, "h": 3, "i": 4, "▁h": 5, "▁hi": 6, "<0xC3>": 7, "<0xA9>": 8},
              "merges": [["▁", "h"], ["▁h", "i"]]}
  })");
  const HfTokenizer t(d, "fallback");
  EXPECT_EQ(t.encode("hi"), (std::vector<int64_t>{1, 6}));  // <s>, "▁hi"
  EXPECT_EQ(t.encode("hi é"), (std::vector<int64_t>{1, 6, 2, 7, 8}));  // é is not in the vocabulary: its two bytes
  EXPECT_EQ(t.decode({1, 6, 2, 7, 8}), "hi é");
  EXPECT_EQ(t.decode({6, 7}), "hi\xEF\xBF\xBD") << "a byte that is not UTF-8 alone decodes to U+FFFD";
}

// The series' tokenizer, exported to the library's format and read back: the same ids for every text,
// the same text for every id list.
TEST(HfTokenizer, TheSeriesTokenizerExportsToTheSameIds) {
  const Tokenizer series = Tokenizer::load(TINYGPT_GOLDEN_DIR "/tokenizer.json");
  const fs::path dir = fs::temp_directory_path() / ("tinygpt_hf_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "tokenizer.json") << series.to_hf_json();
  }
  const Tokenizer back = Tokenizer::load(dir.string());  // a directory holding tokenizer.json
  ASSERT_NE(back.hf(), nullptr);
  EXPECT_EQ(back.vocab_size(), series.vocab_size());
  for (const std::string s : {"In the beginning God created the heaven and the earth.", "it's 1611; they'll say 42!", "  spaces\t\ttabs\n\n",
                              "Café naïve 東京 😀", "", "a"})
    EXPECT_EQ(back.encode(s), series.encode(s)) << s;
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::vector<int64_t> ids(1 + rng() % 8);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % series.vocab_size());
    EXPECT_EQ(back.decode(ids), series.decode(ids));
  }
  fs::remove_all(dir);
}

TEST(HfTokenizer, WhatItDoesNotReadIsRefusedByName) {
  auto refused = [](const std::string& key, const json& value, const std::string& says) {
    json d = small_byte_level();
    if (key == "model.type") d["model"]["type"] = value;
    else d[key] = value;
    try {
      HfTokenizer t(d, "tok.json");
      ADD_FAILURE() << key << " " << value.dump() << " was read";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("model.type", "WordPiece", "model type \"WordPiece\" is not read");
  refused("normalizer", json{{"type", "Lowercase"}}, "normalizer Lowercase is not read");
  refused("pre_tokenizer", json{{"type", "Whitespace"}}, "pre_tokenizer Whitespace is not read");
  refused("decoder", json{{"type", "WordPiece"}}, "decoder WordPiece is not read");
  refused("post_processor", json{{"type", "BertProcessing"}}, "post_processor BertProcessing is not read");
  const fs::path dir = fs::temp_directory_path() / ("tinygpt_hf_empty_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  try {
    Tokenizer::load(dir.string());
    ADD_FAILURE() << "a directory without tokenizer.json was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a directory without tokenizer.json"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tinygpt
