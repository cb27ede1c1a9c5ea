#define PCRE2_CODE_UNIT_WIDTH 8
#include "tinygpt/tokenizer.h"
#include "tinygpt/errors.h"

#include "tinygpt/atomic_file.h"
#include "tinygpt/hf_tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace tinygpt {

namespace {

constexpr const char* kSplit =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

uint64_t key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }

// The compiled split regex, shared (pcre2 code is read-only once compiled).
const pcre2_code* split_regex() {
  static const std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code = [] {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kSplit), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!c) throw std::logic_error("tokenizer: the split regex does not compile");
    return std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)>(c, pcre2_code_free);
  }();
  return code.get();
}

}  // namespace

Tokenizer::Tokenizer(std::vector<std::pair<int64_t, int64_t>> merges)
    : merges_(std::move(merges)), cache_mutex_(std::make_unique<std::mutex>()) {
  bytes_.reserve(256 + merges_.size());
  for (int i = 0; i < 256; ++i) bytes_.emplace_back(1, static_cast<char>(i));
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [a, b] = merges_[i];
    const int64_t limit = 256 + static_cast<int64_t>(i);
    if (a < 0 || b < 0 || a >= limit || b >= limit)
      throw std::invalid_argument("tokenizer: merge " + std::to_string(i) + " [" + std::to_string(a) + ", " +
                                  std::to_string(b) + "] refers to an id that does not exist yet (< " +
                                  std::to_string(limit) + ")");
    if (rank_.count(key(a, b)))
      throw std::invalid_argument("tokenizer: merge " + std::to_string(i) + " repeats an earlier merge");
    rank_[key(a, b)] = static_cast<int64_t>(i);
    bytes_.push_back(bytes_[a] + bytes_[b]);
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::string& given) {
  std::string path = given;
  if (std::filesystem::is_directory(path)) {
    if (!std::filesystem::is_regular_file(path + "/tokenizer.json")) throw InputError(path + ": a directory without tokenizer.json");
    path += "/tokenizer.json";
  }
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open tokenizer file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw InputError(path + ": not valid JSON (" + e.what() + ")");
  }
  if (HfTokenizer::is_hf(j)) {
    Tokenizer t({});
    try {
      t.hf_ = std::make_shared<const HfTokenizer>(j, path);
    } catch (const std::exception& e) {
      throw InputError(e.what());
    }
    return t;
  }
  if (!j.is_object() || !j.contains("merges") || !j["merges"].is_array())
    throw InputError(path + ": expected the series' {\"merges\": [[a, b], ...]} or the tokenizers library's {\"model\": {...}}");
  std::vector<std::pair<int64_t, int64_t>> merges;
  for (const auto& m : j["merges"]) {
    if (!m.is_array() || m.size() != 2 || !m[0].is_number_integer() || !m[1].is_number_integer())
      throw InputError(path + ": merge " + std::to_string(merges.size()) + " is not a pair of integers");
    merges.emplace_back(m[0].get<int64_t>(), m[1].get<int64_t>());
  }
  try {
    return Tokenizer(std::move(merges));
  } catch (const std::invalid_argument& e) {
    throw InputError(path + ": " + e.what());
  }
}

int64_t Tokenizer::vocab_size() const { return hf_ ? hf_->vocab_size() : 256 + static_cast<int64_t>(merges_.size()); }

void Tokenizer::check_serves(int64_t model_vocab, const std::string& what) const {
  if (hf_ ? vocab_size() <= model_vocab : vocab_size() == model_vocab) return;
  throw std::invalid_argument(what + ": vocabulary " + std::to_string(vocab_size()) + (hf_ ? " > the model's " : " != the model's ") +
                              std::to_string(model_vocab));
}

std::string Tokenizer::describe() const {
  return hf_ ? hf_->describe() : "the series' byte-level BPE, " + std::to_string(vocab_size()) + " ids";
}

void Tokenizer::save(const std::string& path) const {
  if (hf_) throw std::logic_error("tokenizer: a Hugging Face tokenizer.json is read, not written in the series' format");
  nlohmann::json j;
  j["merges"] = nlohmann::json::array();
  for (const auto& [a, b] : merges_) j["merges"].push_back({a, b});
  write_atomically(path, [&](std::ostream& out) { out << j.dump() << "\n"; });
}

std::string Tokenizer::to_hf_json() const {
  if (hf_) throw std::logic_error("tokenizer: already the tokenizers library's format");
  auto token = [&](int64_t id) {  // the id's bytes through ByteLevel's map
    std::string t;
    for (unsigned char b : bytes_[static_cast<size_t>(id)]) t += byte_level_char(b);
    return t;
  };
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object(), merges = nlohmann::ordered_json::array();
  for (int64_t id = 0; id < vocab_size(); ++id) {
    const std::string t = token(id);
    if (vocab.contains(t))
      throw std::invalid_argument("tokenizer: ids " + std::to_string(vocab[t].get<int64_t>()) + " and " + std::to_string(id) +
                                  " hold the same bytes; the tokenizers library's format keys a token by its text");
    vocab[t] = id;
  }
  for (const auto& [a, b] : merges_) merges.push_back({token(a), token(b)});
  nlohmann::ordered_json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", nlohmann::ordered_json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kSplit}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return doc.dump() + "\n";
}

std::vector<std::string> Tokenizer::split(const std::string& text) {
  const pcre2_code* re = split_regex();
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(re, nullptr), pcre2_match_data_free);
  std::vector<std::string> out;
  PCRE2_SIZE pos = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (pos < text.size()) {
    const int rc = pcre2_match(re, subject, text.size(), pos, pos == 0 ? 0 : PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
        throw std::invalid_argument("tokenizer: input is not valid UTF-8");
      throw std::runtime_error("tokenizer: regex match failed (" + std::to_string(rc) + ")");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[1] <= ov[0]) break;  // no empty matches in this regex; guard anyway
    out.emplace_back(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
  }
  return out;
}

std::vector<int64_t> Tokenizer::encode_chunk(const std::string& chunk) const {
  std::vector<int64_t> ids(chunk.size());
  for (size_t i = 0; i < chunk.size(); ++i) ids[i] = static_cast<unsigned char>(chunk[i]);
  while (ids.size() > 1) {
    int64_t best = -1;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      auto it = rank_.find(key(ids[i], ids[i + 1]));
      if (it != rank_.end() && (best < 0 || it->second < best)) best = it->second;
    }
    if (best < 0) break;
    const auto [a, b] = merges_[best];
    std::vector<int64_t> next;
    next.reserve(ids.size());
    for (size_t i = 0; i < ids.size();) {
      if (i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) {
        next.push_back(256 + best);
        i += 2;
      } else {
        next.push_back(ids[i++]);
      }
    }
    ids.swap(next);
  }
  return ids;
}

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  if (hf_) return hf_->encode(text);
  std::vector<int64_t> out;
  for (const auto& chunk : split(text)) {
    {
      std::lock_guard<std::mutex> lock(*cache_mutex_);
      auto it = cache_.find(chunk);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    auto ids = encode_chunk(chunk);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(*cache_mutex_);
    if (cache_.size() < 200000) cache_.emplace(chunk, std::move(ids));
  }
  return out;
}

std::string Tokenizer::utf8_replace(const std::string& s) {
  static const std::string kFFFD = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    if (need == 0) {  // never a valid lead byte
      out += kFFFD;
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k <= static_cast<size_t>(need) && i + k < n; ++k) {
      const unsigned char b = p[i + k];
      const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
    }
    if (k == static_cast<size_t>(need) + 1) {
      out.append(s, i, k);
    } else {
      out += kFFFD;  // one replacement for the maximal subpart seen so far
    }
    i += (k == static_cast<size_t>(need) + 1) ? k : k;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  if (hf_) return hf_->decode(ids);
  std::string raw;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw std::invalid_argument("tokenizer: id " + std::to_string(id) + " outside [0, " +
                                  std::to_string(vocab_size()) + ")");
    raw += bytes_[id];
  }
  return utf8_replace(raw);
}

Tokenizer Tokenizer::train(const std::string& text, int64_t vocab_size,
                           const std::function<void(int64_t, int64_t)>& progress) {
  if (vocab_size < 256) throw std::invalid_argument("train-tokenizer: vocab must be >= 256");
  std::unordered_map<std::string, int64_t> freq;
  for (auto& c : split(text)) ++freq[c];
  std::vector<std::vector<int64_t>> words;
  std::vector<int64_t> weight;
  {
    std::map<std::string, int64_t> ordered(freq.begin(), freq.end());  // deterministic order
    for (const auto& [w, f] : ordered) {
      words.emplace_back(w.begin(), w.end());
      for (auto& x : words.back()) x = static_cast<unsigned char>(x);
      weight.push_back(f);
    }
  }
  std::unordered_map<uint64_t, int64_t> counts;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  auto add_pairs = [&](int32_t w, int64_t sign) {
    const auto& ids = words[w];
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const uint64_t k = key(ids[i], ids[i + 1]);
      counts[k] += sign * weight[w];
      if (sign > 0) where[k].push_back(w);
    }
  };
  for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) add_pairs(w, +1);
  std::vector<std::pair<int64_t, int64_t>> merges;
  const int64_t total = vocab_size - 256;
  std::vector<int64_t> stamp(words.size(), -1);
  for (int64_t m = 0; m < total; ++m) {
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [k, c] : counts)
      if (c > best_count || (c == best_count && c > 0 && k < best)) best = k, best_count = c;
    if (best_count <= 0) break;  // nothing left to merge
    const int64_t a = static_cast<int64_t>(best >> 32), b = static_cast<int64_t>(best & 0xffffffffu);
    const int64_t id = 256 + m;
    auto users = std::move(where[best]);
    where.erase(best);
    for (int32_t w : users) {
      if (stamp[w] == m) continue;
      stamp[w] = m;
      auto& ids = words[w];
      bool has = false;
      for (size_t i = 0; i + 1 < ids.size(); ++i) has |= ids[i] == a && ids[i + 1] == b;
      if (!has) continue;
      add_pairs(w, -1);
      std::vector<int64_t> next;
      for (size_t i = 0; i < ids.size();) {
        if (i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) next.push_back(id), i += 2;
        else next.push_back(ids[i++]);
      }
      ids.swap(next);
      add_pairs(w, +1);
    }
    counts.erase(best);
    merges.emplace_back(a, b);
    if (progress && ((m + 1) % 256 == 0 || m + 1 == total)) progress(m + 1, total);
  }
  return Tokenizer(std::move(merges));
}

}  // namespace tinygpt
