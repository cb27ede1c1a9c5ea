// Holds our reader of a Hugging Face tokenizer.json (lib/src/hf_tokenizer.cpp) against the tokenizers
// library's own answers, which tests/tokenizer/hf_cases.py writes: every text encoded to the library's
// ids, every id list decoded to its text. Prints a line per tokenizer and each disagreement (the first
// ten of a tokenizer in full); exit 0 when all agree, 1 otherwise, 2 for bad input.
//   hf_cases_check DIR [NAME=SERIES_TOKENIZER ...]    (DIR/cases.json, DIR/NAME/tokenizer.json)
// NAME=SERIES_TOKENIZER: the cases of NAME (our export of a series tokenizer) must also be what that
// series tokenizer itself gives, so the export changes no id.
#include <nlohmann/json.hpp>

#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "tinygpt/hf_tokenizer.h"
#include "tinygpt/tokenizer.h"

namespace {

std::string ids_text(const std::vector<int64_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: hf_cases_check DIR [NAME=SERIES_TOKENIZER ...]\n";
    return 2;
  }
  const std::string dir = argv[1];
  std::map<std::string, tinygpt::Tokenizer> series;
  try {
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      const size_t eq = a.find('=');
      if (eq == std::string::npos) throw std::invalid_argument(a + " is not NAME=SERIES_TOKENIZER");
      series.emplace(a.substr(0, eq), tinygpt::Tokenizer::load(a.substr(eq + 1)));
    }
  } catch (const std::exception& e) {
    std::cerr << "hf_cases_check: " << e.what() << "\n";
    return 2;
  }
  nlohmann::json doc;
  try {
    std::ifstream in(dir + "/cases.json");
    doc = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    std::cerr << "hf_cases_check: " << dir << "/cases.json: " << e.what() << "\n";
    return 2;
  }
  std::map<std::string, tinygpt::Tokenizer> toks;
  for (const auto& name : doc.at("tokenizers")) {
    try {
      toks.emplace(name.get<std::string>(), tinygpt::Tokenizer::load(dir + "/" + name.get<std::string>()));
    } catch (const std::exception& e) {
      std::cout << name.get<std::string>() << ": not read: " << e.what() << "\n";
      return 1;
    }
  }
  struct Tally {
    int encode = 0, decode = 0, wrong = 0;
  };
  std::map<std::string, Tally> tally;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("tokenizer").get<std::string>();
    const tinygpt::Tokenizer& t = toks.at(name);
    Tally& n = tally[name];
    std::string got, want;
    bool ok = true;
    try {
      if (c.contains("decode")) {
        ++n.decode;
        const auto ids = c.at("decode").get<std::vector<int64_t>>();
        want = c.at("text").get<std::string>();
        got = t.decode(ids);
        ok = got == want && (!series.count(name) || series.at(name).decode(ids) == want);
        got = "decode " + ids_text(ids) + ": " + nlohmann::json(got).dump() + ", the library " + nlohmann::json(want).dump();
      } else {
        ++n.encode;
        const auto text = c.at("text").get<std::string>();
        const auto ids = t.encode(text);
        const auto lib = c.at("ids").get<std::vector<int64_t>>();
        ok = ids == lib && (!series.count(name) || series.at(name).encode(text) == lib);
        got = "encode " + nlohmann::json(text).dump() + ": " + ids_text(ids) + ", the library " + ids_text(lib);
      }
    } catch (const std::exception& e) {
      ok = false;
      got = c.dump() + ": threw " + e.what();
    }
    if (!ok && ++n.wrong <= 10) std::cout << name << ": " << got << "\n";
  }
  int wrong = 0;
  for (const auto& [name, n] : tally) {
    std::cout << name << " (" << toks.at(name).describe() << "): " << n.encode << " texts encoded, " << n.decode << " id lists decoded, "
              << n.wrong << " disagreeing with tokenizers " << doc.value("library", std::string("?")) << "\n";
    wrong += n.wrong;
  }
  return wrong ? 1 : 0;
}
