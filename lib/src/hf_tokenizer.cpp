#define PCRE2_CODE_UNIT_WIDTH 8
#include "tinygpt/hf_tokenizer.h"

#include <pcre2.h>
#ifdef TINYGPT_WITH_UTF8PROC
#include <utf8proc.h>  // NFC / NFKC normalizers
#endif

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "tinygpt/tokenizer.h"

namespace tinygpt {

namespace {

using nlohmann::json;

// GPT-2's split, which the ByteLevel pre-tokenizer applies when use_regex is set.
constexpr const char* kByteLevelSplit = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8_of(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6)), s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12)), s += static_cast<char>(0x80 | ((c >> 6) & 0x3F)), s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18)), s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F)), s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// The bytes of the UTF-8 character that begins with `lead`.
size_t char_len(char lead) {
  const auto b = static_cast<unsigned char>(lead);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// The code points of valid UTF-8 (the caller checked it), each with its bytes.
std::vector<std::string> chars_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = char_len(s[i]);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t code_point(const std::string& ch) {
  const auto* u = reinterpret_cast<const unsigned char*>(ch.data());
  switch (ch.size()) {
    case 1: return u[0];
    case 2: return ((u[0] & 0x1Fu) << 6) | (u[1] & 0x3Fu);
    case 3: return ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
    default: return ((u[0] & 0x07u) << 18) | ((u[1] & 0x3Fu) << 12) | ((u[2] & 0x3Fu) << 6) | (u[3] & 0x3Fu);
  }
}

// Valid UTF-8 is exactly what Python's "replace" decoding leaves as it was.
bool valid_utf8(const std::string& s) { return Tokenizer::utf8_replace(s) == s; }

// GPT-2's byte-to-character table: printable bytes stand for themselves, the rest for 256 + n in order.
struct ByteTable {
  std::string to_char[256];
  std::unordered_map<uint32_t, unsigned char> to_byte;
  ByteTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool kept = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t c = kept ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      to_char[b] = utf8_of(c);
      to_byte[c] = static_cast<unsigned char>(b);
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

// A compiled PCRE2 pattern (Unicode properties on), freed with it.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::runtime_error(where + ": the regex " + json(pattern).dump() + " does not compile at " + std::to_string(off) + ": " +
                               reinterpret_cast<const char*>(msg));
    }
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Every non-overlapping match, left to right: (start, end) byte offsets (an empty match moves on one character).
  std::vector<std::pair<size_t, size_t>> matches(const std::string& s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t at = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, 0, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // empty: skip one character
        if (ov[0] >= s.size()) break;
        at = ov[0] + char_len(s[ov[0]]);
        continue;
      }
      out.emplace_back(ov[0], ov[1]);
      at = ov[1];
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

// A pattern as tokenizer.json writes it: {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<Regex> regex;
  std::vector<std::pair<size_t, size_t>> matches(const std::string& s) const {
    if (regex) return regex->matches(s);
    std::vector<std::pair<size_t, size_t>> out;
    if (literal.empty()) return out;
    for (size_t at = s.find(literal); at != std::string::npos; at = s.find(literal, at + literal.size()))
      out.emplace_back(at, at + literal.size());
    return out;
  }
};

Pattern pattern_of(const json& j, const std::string& where) {
  Pattern p;
  if (j.is_object() && j.contains("String") && j["String"].is_string()) p.literal = j["String"].get<std::string>();
  else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) p.regex = std::make_shared<Regex>(j["Regex"].get<std::string>(), where);
  else throw std::runtime_error(where + ": a pattern is {\"String\": ...} or {\"Regex\": ...}, not " + j.dump());
  return p;
}

std::string replace_all(const std::string& s, const Pattern& p, const std::string& with) {
  std::string out;
  size_t at = 0;
  for (const auto& [b, e] : p.matches(s)) out += s.substr(at, b - at) + with, at = e;
  return out + s.substr(at);
}

// A piece of the input on its way to the model: its text and whether it starts the input (Metaspace's
// prepend_scheme "first").
struct Piece {
  std::string text;
  bool at_start = false;
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// Splits one piece at a pattern's matches (or, inverted, at what lies between them), as the behavior says.
std::vector<Piece> split_piece(const Piece& piece, const Pattern& pat, Behavior how, bool invert) {
  const std::string& s = piece.text;
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> spans;  // (range, is a match)
  size_t at = 0;
  for (const auto& m : pat.matches(s)) {
    if (m.first > at) spans.push_back({{at, m.first}, invert});
    spans.push_back({m, !invert});
    at = m.second;
  }
  if (at < s.size()) spans.push_back({{at, s.size()}, invert});
  std::vector<std::string> out;
  bool glue_next = false;     // MergedWithNext: the last piece waits for the next one
  bool last_matched = false;  // Contiguous: the last piece was a match
  for (const auto& [r, matched] : spans) {
    const std::string t = s.substr(r.first, r.second - r.first);
    switch (how) {
      case Behavior::Removed:
        if (!matched) out.push_back(t);
        break;
      case Behavior::Isolated:
        out.push_back(t);
        break;
      case Behavior::MergedWithPrevious:
        if (matched && !out.empty()) out.back() += t;
        else out.push_back(t);
        break;
      case Behavior::MergedWithNext:
        if (glue_next) out.back() += t;
        else out.push_back(t);
        glue_next = matched;
        break;
      case Behavior::Contiguous:
        if (matched && last_matched) out.back() += t;
        else out.push_back(t);
        last_matched = matched;
        break;
    }
  }
  std::vector<Piece> pieces;
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].empty()) pieces.push_back({out[i], piece.at_start && pieces.empty() && (i == 0 || how != Behavior::Removed)});
  return pieces;
}

Behavior behavior_of(const json& j, const std::string& where) {
  const std::string b = j.is_string() ? j.get<std::string>() : "";
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  throw std::runtime_error(where + ": split behavior " + j.dump() + " is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

std::string type_of(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) throw std::runtime_error(where + ": an object with a \"type\" expected, got " + j.dump().substr(0, 80));
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool otherwise) { return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : otherwise; }
std::string text(const json& j, const char* key, const std::string& otherwise = "") {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : otherwise;
}

// --- normalizers ---

using Normalize = std::function<std::string(const std::string&)>;

#ifdef TINYGPT_WITH_UTF8PROC
// NFC or NFKC over the whole string (a NUL inside it included: utf8proc_NFC would stop there).
std::string unicode_form(const std::string& s, bool compat) {
  utf8proc_uint8_t* out = nullptr;
  const auto opts = static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | (compat ? UTF8PROC_COMPAT : 0));
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out, opts);
  if (n < 0) throw std::invalid_argument(std::string("tokenizer: the text cannot be normalised: ") + utf8proc_errmsg(n));
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}
#endif

Normalize normalizer_of(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string t = type_of(j, where);
  if (t == "NFC" || t == "NFKC") {
#ifdef TINYGPT_WITH_UTF8PROC
    const bool compat = t == "NFKC";
    return [compat](const std::string& s) { return unicode_form(s, compat); };
#else
    throw std::runtime_error(where + ": normalizer " + t + " needs utf8proc, which this build was made without (libutf8proc-dev)");
#endif
  }
  if (t == "Prepend") {
    const std::string p = text(j, "prepend");
    return [p](const std::string& s) { return s.empty() ? s : p + s; };
  }
  if (t == "Replace") {
    const Pattern pat = pattern_of(j.value("pattern", json()), where + " Replace");
    const std::string with = text(j, "content");
    return [pat, with](const std::string& s) { return replace_all(s, pat, with); };
  }
  if (t == "Sequence") {
    std::vector<Normalize> all;
    for (const auto& n : j.value("normalizers", json::array()))
      if (auto f = normalizer_of(n, where)) all.push_back(f);
    return [all](const std::string& s) {
      std::string r = s;
      for (const auto& f : all) r = f(r);
      return r;
    };
  }
  throw std::runtime_error(where + ": normalizer " + t + " is not read (NFC, NFKC, Prepend, Replace, Sequence)");
}

// --- pre-tokenizers ---

using PreTokenize = std::function<std::vector<Piece>(std::vector<Piece>)>;

std::string to_byte_level(const std::string& s) {
  std::string out;
  for (unsigned char b : s) out += byte_table().to_char[b];
  return out;
}

PreTokenize pre_tokenizer_of(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string t = type_of(j, where);
  if (t == "ByteLevel") {
    const bool prefix = flag(j, "add_prefix_space", true), use_regex = flag(j, "use_regex", true);
    auto re = std::make_shared<Pattern>(Pattern{"", std::make_shared<Regex>(kByteLevelSplit, where)});
    return [prefix, use_regex, re](std::vector<Piece> in) {
      std::vector<Piece> out;
      for (Piece& p : in) {
        if (prefix && p.text.rfind(' ', 0) != 0) p.text = " " + p.text;
        for (Piece& q : use_regex ? split_piece(p, *re, Behavior::Isolated, false) : std::vector<Piece>{p})
          out.push_back({to_byte_level(q.text), q.at_start});
      }
      return out;
    };
  }
  if (t == "Split") {
    const Pattern pat = pattern_of(j.value("pattern", json()), where + " Split");
    const Behavior how = behavior_of(j.value("behavior", json()), where);
    const bool invert = flag(j, "invert", false);
    return [pat, how, invert](std::vector<Piece> in) {
      std::vector<Piece> out;
      for (const Piece& p : in)
        for (Piece& q : split_piece(p, pat, how, invert)) out.push_back(std::move(q));
      return out;
    };
  }
  if (t == "Metaspace") {
    const std::string rep = text(j, "replacement", "\xE2\x96\x81");
    std::string scheme = text(j, "prepend_scheme", flag(j, "add_prefix_space", true) ? "always" : "never");
    if (scheme != "always" && scheme != "first" && scheme != "never")
      throw std::runtime_error(where + ": Metaspace prepend_scheme " + json(scheme).dump() + " is not always, first or never");
    const bool split = flag(j, "split", true);
    const Pattern space{" ", nullptr}, marker{rep, nullptr};
    return [rep, scheme, split, space, marker](std::vector<Piece> in) {
      std::vector<Piece> out;
      for (Piece& p : in) {
        p.text = replace_all(p.text, space, rep);
        if (p.text.rfind(rep, 0) != 0 && (scheme == "always" || (scheme == "first" && p.at_start))) p.text = rep + p.text;
        if (!split) {
          out.push_back(p);
          continue;
        }
        for (Piece& q : split_piece(p, marker, Behavior::MergedWithNext, false)) out.push_back(std::move(q));
      }
      return out;
    };
  }
  if (t == "Digits") {
    const bool each = flag(j, "individual_digits", false);
    Pattern digits{"", std::make_shared<Regex>("\\p{Nd}", where)};
    return [each, digits](std::vector<Piece> in) {
      std::vector<Piece> out;
      for (const Piece& p : in)
        for (Piece& q : split_piece(p, digits, each ? Behavior::Isolated : Behavior::Contiguous, false)) out.push_back(std::move(q));
      return out;
    };
  }
  if (t == "Sequence") {
    std::vector<PreTokenize> all;
    for (const auto& n : j.value("pretokenizers", json::array()))
      if (auto f = pre_tokenizer_of(n, where)) all.push_back(f);
    return [all](std::vector<Piece> in) {
      for (const auto& f : all) in = f(std::move(in));
      return in;
    };
  }
  throw std::runtime_error(where + ": pre_tokenizer " + t + " is not read (ByteLevel, Split, Metaspace, Digits, Sequence)");
}

// --- decoders: token strings in, token strings out (joined at the end) ---

using Decode = std::function<std::vector<std::string>(std::vector<std::string>)>;

Decode decoder_of(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string t = type_of(j, where);
  if (t == "ByteLevel") {
    return [](std::vector<std::string> in) {
      std::string bytes;
      for (const auto& tok : in)
        for (const auto& ch : chars_of(tok)) {
          const auto it = byte_table().to_byte.find(code_point(ch));
          if (it != byte_table().to_byte.end()) bytes += static_cast<char>(it->second);
          else bytes += ch;
        }
      return std::vector<std::string>{Tokenizer::utf8_replace(bytes)};  // Rust's from_utf8_lossy, as Python's "replace"
    };
  }
  if (t == "Replace") {
    const Pattern pat = pattern_of(j.value("pattern", json()), where + " Replace");
    const std::string with = text(j, "content");
    return [pat, with](std::vector<std::string> in) {
      for (auto& tok : in) tok = replace_all(tok, pat, with);
      return in;
    };
  }
  if (t == "ByteFallback") {
    return [](std::vector<std::string> in) {
      std::vector<std::string> out;
      std::string bytes;
      size_t count = 0;
      auto flush = [&] {
        if (!count) return;
        if (valid_utf8(bytes)) out.push_back(bytes);
        else
          for (size_t i = 0; i < count; ++i) out.emplace_back("\xEF\xBF\xBD");
        bytes.clear(), count = 0;
      };
      for (const auto& tok : in) {
        if (tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>' && std::isxdigit(static_cast<unsigned char>(tok[3])) &&
            std::isxdigit(static_cast<unsigned char>(tok[4]))) {
          bytes += static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)), ++count;
          continue;
        }
        flush();
        out.push_back(tok);
      }
      flush();
      return out;
    };
  }
  if (t == "Fuse") {
    return [](std::vector<std::string> in) {
      std::string all;
      for (const auto& tok : in) all += tok;
      return std::vector<std::string>{all};
    };
  }
  if (t == "Strip") {
    const std::string c = text(j, "content", " ");
    const int64_t start = j.value("start", 0), stop = j.value("stop", 0);
    return [c, start, stop](std::vector<std::string> in) {
      for (auto& tok : in) {
        std::vector<std::string> ch = chars_of(tok);
        size_t b = 0, e = ch.size();
        for (int64_t i = 0; i < start && b < e && ch[b] == c; ++i) ++b;
        for (int64_t i = 0; i < stop && e > b && ch[e - 1] == c; ++i) --e;
        std::string r;
        for (size_t i = b; i < e; ++i) r += ch[i];
        tok = r;
      }
      return in;
    };
  }
  if (t == "Metaspace") {
    const std::string rep = text(j, "replacement", "\xE2\x96\x81");
    const std::string scheme = text(j, "prepend_scheme", flag(j, "add_prefix_space", true) ? "always" : "never");
    return [rep, scheme](std::vector<std::string> in) {
      for (size_t i = 0; i < in.size(); ++i) {
        std::string r;
        for (const auto& ch : chars_of(in[i])) {
          if (ch != rep) r += ch;
          else if (!(i == 0 && scheme != "never")) r += ' ';
        }
        in[i] = r;
      }
      return in;
    };
  }
  if (t == "Sequence") {
    std::vector<Decode> all;
    for (const auto& n : j.value("decoders", json::array()))
      if (auto f = decoder_of(n, where)) all.push_back(f);
    return [all](std::vector<std::string> in) {
      for (const auto& f : all) in = f(std::move(in));
      return in;
    };
  }
  throw std::runtime_error(where + ": decoder " + t + " is not read (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)");
}

struct Added {
  std::string content;
  int64_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

// A word character as the library's single_word test sees it: a letter, a digit or '_'.
bool word_char(const std::string& ch) {
  static const Regex word(R"(^[\p{L}\p{N}_]$)", "tokenizer");
  return !word.matches(ch).empty();
}
bool space_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

struct HfTokenizer::Impl {
  std::string where;
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> token_of;  // id -> its text ("" where no token has the id)
  std::vector<bool> has_id, special_id;
  std::unordered_map<std::string, int64_t> rank;  // merge key -> rank
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false, byte_level = false;
  std::optional<int64_t> unk;
  std::vector<Added> added;  // longest first
  Normalize normalize;
  PreTokenize pre_tokenize;
  Decode decode;
  // The post-processor's single template: ids before and after the sequence (none: the sequence alone).
  std::vector<int64_t> before, after;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  static std::string merge_key(const std::string& a, const std::string& b) { return std::to_string(a.size()) + ":" + a + b; }

  void add_id(int64_t id, const std::string& tok, bool special) {
    if (id < 0 || id > (int64_t{1} << 24)) throw std::runtime_error(where + ": token " + json(tok).dump() + " has id " + std::to_string(id));
    if (static_cast<size_t>(id) >= token_of.size()) token_of.resize(id + 1), has_id.resize(id + 1), special_id.resize(id + 1);
    token_of[id] = tok, has_id[id] = true, special_id[id] = special_id[id] || special;
  }

  std::vector<int64_t> bpe(const std::string& word) const {
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      const auto it = cache.find(word);
      if (it != cache.end()) return it->second;
    }
    std::vector<int64_t> ids;
    const auto whole = vocab.find(word);
    if (ignore_merges && whole != vocab.end()) {
      ids.push_back(whole->second);
    } else {
      std::vector<std::string> sym = chars_of(word);
      while (sym.size() > 1) {
        int64_t best = std::numeric_limits<int64_t>::max();
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
          const auto it = rank.find(merge_key(sym[i], sym[i + 1]));
          if (it != rank.end() && it->second < best) best = it->second, at = i;
        }
        if (best == std::numeric_limits<int64_t>::max()) break;
        const std::string a = sym[at], b = sym[at + 1];
        std::vector<std::string> next;
        for (size_t i = 0; i < sym.size(); ++i) {
          if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) next.push_back(a + b), ++i;
          else next.push_back(sym[i]);
        }
        sym.swap(next);
      }
      bool last_unk = false;
      for (const auto& s : sym) {
        const auto it = vocab.find(s);
        if (it != vocab.end()) {
          ids.push_back(it->second), last_unk = false;
          continue;
        }
        if (byte_fallback) {
          std::vector<int64_t> bytes;
          for (unsigned char c : s) {
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", c);
            const auto b = vocab.find(name);
            if (b == vocab.end()) {
              bytes.clear();
              break;
            }
            bytes.push_back(b->second);
          }
          if (!bytes.empty()) {
            ids.insert(ids.end(), bytes.begin(), bytes.end()), last_unk = false;
            continue;
          }
        }
        if (!unk) throw std::invalid_argument(where + ": " + json(s).dump() + " is not in the vocabulary and the model has no unk_token");
        if (!(fuse_unk && last_unk)) ids.push_back(*unk);
        last_unk = true;
      }
    }
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() < 200000) cache.emplace(word, ids);  // bounded, as the series' per-chunk cache is
    return ids;
  }
};

bool HfTokenizer::is_hf(const json& doc) { return doc.is_object() && doc.contains("model") && doc["model"].is_object(); }

HfTokenizer::HfTokenizer(const json& doc, const std::string& where) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.where = where;
  const json& model = doc.at("model");
  const std::string type = text(model, "type", model.contains("merges") ? "BPE" : "");
  if (type != "BPE") throw std::runtime_error(where + ": model type " + json(type).dump() + " is not read (BPE only)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      throw std::runtime_error(where + ": model." + key + " " + model[key].dump() + " is not read");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0)
    throw std::runtime_error(where + ": model.dropout " + model["dropout"].dump() + " makes encoding random; not read");
  m.byte_fallback = flag(model, "byte_fallback", false);
  m.fuse_unk = flag(model, "fuse_unk", false);
  m.ignore_merges = flag(model, "ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw std::runtime_error(where + ": model.vocab is not an object");
  for (const auto& [tok, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) throw std::runtime_error(where + ": model.vocab[" + json(tok).dump() + "] is not an id");
    m.vocab[tok] = id.get<int64_t>();
    m.add_id(id.get<int64_t>(), tok, false);
  }
  int64_t r = 0;
  for (const auto& mg : model.value("merges", json::array())) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) throw std::runtime_error(where + ": merge " + std::to_string(r) + " " + mg.dump() + " is not \"a b\"");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
    } else {
      throw std::runtime_error(where + ": merge " + std::to_string(r) + " " + mg.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    m.rank.emplace(Impl::merge_key(a, b), r++);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = m.vocab.find(model["unk_token"].get<std::string>());
    if (it == m.vocab.end()) throw std::runtime_error(where + ": model.unk_token " + model["unk_token"].dump() + " is not in the vocabulary");
    m.unk = it->second;
  }
  for (const auto& a : doc.value("added_tokens", json::array())) {
    Added t;
    t.content = text(a, "content");
    t.id = a.value("id", int64_t{-1});
    t.special = flag(a, "special", false), t.lstrip = flag(a, "lstrip", false), t.rstrip = flag(a, "rstrip", false);
    t.single_word = flag(a, "single_word", false);
    if (t.content.empty()) throw std::runtime_error(where + ": an added token without content: " + a.dump());
    m.add_id(t.id, t.content, t.special);
    m.added.push_back(t);
  }
  std::stable_sort(m.added.begin(), m.added.end(), [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
  m.normalize = normalizer_of(doc.value("normalizer", json()), where + " normalizer");
  const json pre = doc.value("pre_tokenizer", json());
  m.pre_tokenize = pre_tokenizer_of(pre, where + " pre_tokenizer");
  m.byte_level = pre.dump().find("\"ByteLevel\"") != std::string::npos;
  m.decode = decoder_of(doc.value("decoder", json()), where + " decoder");
  // The post-processor: ids around the sequence from TemplateProcessing's single template.
  std::function<void(const json&)> post = [&](const json& p) {
    if (p.is_null()) return;
    const std::string t = type_of(p, where + " post_processor");
    if (t == "ByteLevel") return;
    if (t == "Sequence") {
      for (const auto& q : p.value("processors", json::array())) post(q);
      return;
    }
    if (t != "TemplateProcessing") throw std::runtime_error(where + ": post_processor " + t + " is not read (TemplateProcessing, ByteLevel, Sequence)");
    bool seen_a = false;
    for (const auto& item : p.value("single", json::array())) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& st = p.at("special_tokens").at(name);
      for (const auto& id : st.at("ids")) (seen_a ? m.after : m.before).push_back(id.get<int64_t>());
    }
  };
  post(doc.value("post_processor", json()));
}

HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->token_of.size()); }

const std::string& byte_level_char(unsigned char b) { return byte_table().to_char[b]; }

std::string HfTokenizer::describe() const {
  const Impl& m = *impl_;
  return std::string("BPE, ") + (m.byte_level ? "byte-level" : m.byte_fallback ? "byte fallback" : "characters") + ", " +
         std::to_string(vocab_size()) + " ids, " + std::to_string(m.added.size()) + " added token" + (m.added.size() == 1 ? "" : "s");
}

std::vector<int64_t> HfTokenizer::encode(const std::string& input) const {
  const Impl& m = *impl_;
  if (!valid_utf8(input)) throw std::invalid_argument("tokenizer: the text is not valid UTF-8");
  // The added tokens first, on the raw text (longest at each place), each one id; the text between them
  // goes through the normalizer, the pre-tokenizer and the model.
  struct Segment {
    std::string text;
    int64_t id = -1;
    size_t offset = 0;
  };
  std::vector<Segment> segs;
  size_t from = 0, at = 0;
  while (at < input.size()) {
    const Added* hit = nullptr;
    for (const auto& a : m.added) {
      if (input.compare(at, a.content.size(), a.content) != 0) continue;
      if (a.single_word) {
        const size_t end = at + a.content.size();
        size_t prev = at > 0 ? at - 1 : 0;  // where the character before begins: back over its continuation bytes
        while (prev > 0 && (static_cast<unsigned char>(input[prev]) & 0xC0) == 0x80) --prev;
        const bool before_ok = at == 0 || !word_char(input.substr(prev, at - prev));
        const bool after_ok = end >= input.size() || !word_char(chars_of(input.substr(end, 4)).front());
        if (!before_ok || !after_ok) continue;
      }
      hit = &a;
      break;
    }
    if (!hit) {
      at += char_len(input[at]);
      continue;
    }
    size_t start = at, end = at + hit->content.size();
    if (hit->lstrip)
      while (start > from && space_char(input[start - 1])) --start;
    if (hit->rstrip)
      while (end < input.size() && space_char(input[end])) ++end;
    if (start > from) segs.push_back({input.substr(from, start - from), -1, from});
    segs.push_back({hit->content, hit->id, start});
    from = at = end;
  }
  if (from < input.size()) segs.push_back({input.substr(from), -1, from});
  std::vector<int64_t> ids = m.before;
  for (const Segment& s : segs) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    const std::string norm = m.normalize ? m.normalize(s.text) : s.text;
    if (norm.empty()) continue;
    std::vector<Piece> pieces{{norm, s.offset == 0}};
    if (m.pre_tokenize) pieces = m.pre_tokenize(std::move(pieces));
    for (const Piece& p : pieces) {
      const std::vector<int64_t> w = m.bpe(p.text);
      ids.insert(ids.end(), w.begin(), w.end());
    }
  }
  ids.insert(ids.end(), m.after.begin(), m.after.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids) const {
  const Impl& m = *impl_;
  std::vector<std::string> toks;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || !m.has_id[static_cast<size_t>(id)])
      throw std::invalid_argument("tokenizer: id " + std::to_string(id) + " is not in the vocabulary (" + std::to_string(vocab_size()) + " ids)");
    if (m.special_id[static_cast<size_t>(id)]) continue;  // the library's default: special tokens skipped
    toks.push_back(m.token_of[static_cast<size_t>(id)]);
  }
  if (!m.decode) {
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  std::string out;
  for (const auto& t : m.decode(std::move(toks))) out += t;
  return out;
}

}  // namespace tinygpt
