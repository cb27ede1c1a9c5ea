// A Hugging Face directory's own tokenizer.json (the tokenizers library's format): a BPE model over
// either byte-level pieces (GPT-2, Llama 3, Qwen: every byte mapped to a printable character) or
// characters with byte fallback (Llama 2, Mistral: `<0xNN>` tokens for what the vocabulary lacks), with
// the normalizer, pre-tokenizer, post-processor and decoder the file names, and its added tokens.
//
// What is read (anything else is refused by its type name, with the key that asked for it):
//   normalizer     NFC, NFKC, Prepend, Replace (a string or a regex), Sequence, null
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex), Split (a string or a regex; isolated, removed,
//                  merged with the previous or the next piece, contiguous; invert), Metaspace (replacement,
//                  prepend_scheme always / first / never, split), Digits, Sequence, null
//   model          BPE: vocab, merges ("a b" or ["a", "b"]), byte_fallback, unk_token, fuse_unk,
//                  ignore_merges (no continuing_subword_prefix / end_of_word_suffix, no dropout)
//   post_processor TemplateProcessing (its single template), ByteLevel, Sequence, null
//   decoder        ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence, null
//   added_tokens   matched on the raw text before anything else, longest first (lstrip, rstrip, single_word)
// encode() is the library's `encode(text).ids` (special tokens added by the post-processor) and decode()
// its `decode(ids)` (special tokens skipped), both held against tokenizers 0.23 (tests/tokenizer/).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tinygpt {

class HfTokenizer {
 public:
  // From the parsed tokenizer.json; `where` names the file in errors. Throws std::runtime_error naming
  // the key and what it holds for anything outside what the header lists.
  HfTokenizer(const nlohmann::json& doc, const std::string& where);
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  // True for a tokenizers-library document (it has a "model" object), false for the series' format.
  static bool is_hf(const nlohmann::json& doc);

  // Any bytes: invalid UTF-8 is refused (std::invalid_argument), as the library's str input cannot hold it.
  std::vector<int64_t> encode(const std::string& text) const;
  // Throws std::invalid_argument for an id the vocabulary does not have.
  std::string decode(const std::vector<int64_t>& ids) const;
  // One more than the largest id of the vocabulary and the added tokens.
  int64_t vocab_size() const;
  // One line: the model and its pieces ("BPE, byte-level, 50,257 ids, 1 added token").
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GPT-2's byte-level alphabet (the ByteLevel pre-tokenizer's): the character, as UTF-8, that byte `b`
// stands for - printable bytes themselves, the others 256 + n in order.
const std::string& byte_level_char(unsigned char b);

}  // namespace tinygpt
