// The series' Part 1 byte-level BPE tokenizer (SPEC 8): tokenizer.json {"merges": [[a, b], ...]},
// ids 0-255 raw bytes, merge i makes id 256+i. Text is split by the series' regex (PCRE2 with
// Unicode properties), each chunk's bytes merged lowest-merge-first. Decoding replaces invalid
// UTF-8 with U+FFFD exactly as Python's bytes.decode("utf-8", "replace") does.
// Leaves out special tokens: the series has none.
//
// load() also reads a Hugging Face directory's own tokenizer.json (the tokenizers library's format:
// hf_tokenizer.h), told apart by its "model" object; such a tokenizer encodes and decodes as that
// library does, and is read only (no merges, no save, no training).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tinygpt {

class HfTokenizer;

class Tokenizer {
 public:
  // A tokenizer with the given merges; throws std::invalid_argument if a merge refers to an id
  // that does not exist yet (a, b < 256 + its index).
  explicit Tokenizer(std::vector<std::pair<int64_t, int64_t>> merges);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Reads tokenizer.json, the series' or the tokenizers library's (a file or a directory holding one);
  // throws std::runtime_error naming the file and the problem.
  static Tokenizer load(const std::string& path);
  // Writes tokenizer.json atomically (temporary file renamed into place); the series' format only
  // (std::logic_error for a Hugging Face tokenizer).
  void save(const std::string& path) const;
  // The series' tokenizer in the tokenizers library's format (a Split on the series' regex, then
  // ByteLevel's byte-to-character map; each id's bytes as its token; merges as pairs of tokens), which
  // that library and transformers load and which encodes every text to the same ids. std::logic_error
  // for a Hugging Face tokenizer; std::invalid_argument where two ids hold the same bytes (the format
  // keys tokens by their text).
  std::string to_hf_json() const;

  // Counts adjacent pairs over the deduplicated chunks weighted by frequency and merges the most
  // frequent (ties: the smallest pair), until `vocab_size` ids. progress(merges_done, total).
  static Tokenizer train(const std::string& text, int64_t vocab_size,
                         const std::function<void(int64_t, int64_t)>& progress = {});

  // Throws std::invalid_argument on invalid UTF-8 input.
  std::vector<int64_t> encode(const std::string& text) const;
  // Throws std::invalid_argument for ids outside [0, vocab_size).
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const;
  // Whether this tokenizer serves a model of `model_vocab` ids: the series' exactly as many; a Hugging Face
  // one at most as many (embedding matrices are padded past the tokenizer's ids: Qwen3's 151,936 rows for
  // 151,669 ids). Throws std::invalid_argument naming both counts, prefixed with `what`, where it does not.
  void check_serves(int64_t model_vocab, const std::string& what) const;
  // The series' merges (empty for a Hugging Face tokenizer).
  const std::vector<std::pair<int64_t, int64_t>>& merges() const { return merges_; }
  // The Hugging Face tokenizer this one reads through, or nullptr for the series' own.
  const HfTokenizer* hf() const { return hf_.get(); }
  // One line naming it: "the series' byte-level BPE, 4096 ids", or the Hugging Face tokenizer's own.
  std::string describe() const;

  // The series' split, exposed for tests: text -> chunks.
  static std::vector<std::string> split(const std::string& text);
  // bytes -> UTF-8 with U+FFFD for each maximal invalid subpart (Python's "replace").
  static std::string utf8_replace(const std::string& bytes);

 private:
  std::vector<int64_t> encode_chunk(const std::string& chunk) const;
  std::vector<std::pair<int64_t, int64_t>> merges_;
  std::shared_ptr<const HfTokenizer> hf_;
  std::unordered_map<uint64_t, int64_t> rank_;  // (a << 32 | b) -> merge index
  std::vector<std::string> bytes_;              // id -> its bytes
  mutable std::unique_ptr<std::mutex> cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;  // per-chunk encode cache
};

}  // namespace tinygpt
