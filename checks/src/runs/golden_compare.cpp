// Golden files against a fresh computation: the comparison alone, no model, so the fuzz target
// (fuzz/fuzz_golden.cpp) can drive it with any recorded file.
#include "tinygpt/checks/golden_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "tinygpt/errors.h"

namespace tinygpt::checks {

namespace {

// A recorded field that parses but is not what it should be (a float where an id goes, ...) is
// named like a missing one, never converted: nlohmann's get<int64_t>() of 1e54 is undefined
// behaviour (found by fuzz/fuzz_golden.cpp).
struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t integer(const nlohmann::json& j, const char* what) {
  if (!j.is_number_integer()) throw Malformed(std::string(what) + " must be an integer, got " + j.dump().substr(0, 40));
  return j.get<int64_t>();
}

std::vector<int64_t> integers(const nlohmann::json& j, const char* what) {
  if (!j.is_array()) throw Malformed(std::string(what) + " must be an array of integers");
  std::vector<int64_t> v;
  v.reserve(j.size());
  for (const auto& x : j) v.push_back(integer(x, what));
  return v;
}

// Text around position p of ids: a few tokens either side, decoded.
std::string around(const Tokenizer& tok, const std::vector<int64_t>& ids, size_t p) {
  const size_t lo = p >= 8 ? p - 8 : 0, hi = std::min(ids.size(), p + 4);
  return tok.decode(std::vector<int64_t>(ids.begin() + lo, ids.begin() + hi));
}

std::string piece(const Tokenizer& tok, int64_t id) { return "'" + tok.decode({id}) + "'"; }

bool in(const nlohmann::json& arr, int64_t id, int n) {
  for (int k = 0; k < n && k < static_cast<int>(arr.size()); ++k)
    if (integer(arr.at(k), "top_ids") == id) return true;
  return false;
}

// Compares one recorded trace with a fresh one.
// A golden case's row: pass or fail, and what was found.
CheckResult golden_row(std::string name, bool passed, std::string detail) {
  CheckResult r;
  r.name = std::move(name);
  r.status = passed ? Status::Pass : Status::Fail;
  r.detail = std::move(detail);
  return r;
}

// Compares one recorded trace with a fresh one.
CheckResult compare_trace(const std::string& name, const nlohmann::json& want, const nlohmann::json& got,
                          bool same_env, const Tokenizer& tok) {
  CheckResult r = golden_row(name, true, "");
  double worst = 0;
  if (got.contains("error")) return golden_row(name, false, "error: " + got["error"].get<std::string>());
  const auto wi = integers(want.at("ids"), "ids"), gi = got.at("ids").get<std::vector<int64_t>>();
  const int64_t t0 = integer(want.at("prompt_len"), "prompt_len");
  for (const int64_t id : wi)
    if (id < 0 || id >= tok.vocab_size())
      throw Malformed("ids: id " + std::to_string(id) + " outside [0, " + std::to_string(tok.vocab_size()) + ")");
  const auto& wd = want.at("digest"), &gd = got.at("digest");
  size_t first = wi.size();
  for (size_t p = 0; p < std::min(wi.size(), gi.size()); ++p)
    if (wi[p] != gi[p]) {
      first = p;
      break;
    }
  if (wi.size() != gi.size() && first == wi.size()) first = std::min(wi.size(), gi.size());
  // Logit digests up to and including the step that chose the first differing token.
  const size_t steps = std::min<size_t>(wd.at("top_ids").size(), first >= static_cast<size_t>(t0) ? first - t0 + 1 : 0);
  for (size_t s = 0; s < std::min(steps, gd.at("top_ids").size()); ++s) {
    // Compare logits id by id where both top-5 lists hold the id.
    for (int k = 0; k < kDigestTop; ++k)
      for (int m = 0; m < kDigestTop; ++m)
        if (wd.at("top_ids").at(s).at(k) == gd["top_ids"][s][m])
          worst = std::max(worst, std::abs(wd.at("top_logits").at(s).at(k).get<double>() - gd["top_logits"][s][m].get<double>()));
  }
  char fig[96];
  std::snprintf(fig, sizeof fig, "largest logit diff %.2e", worst);
  r.figure = worst;
  r.bound = "top-5 logits within " + sci(kDigestTolerance) + ", tokens exact (near-ties elsewhere)";
  if (worst > kDigestTolerance) {
    r.status = Status::Fail;
    r.detail = std::string(fig) + " > tolerance " + std::to_string(kDigestTolerance);
  }
  if (first < wi.size()) {
    const size_t step = first - t0;
    std::string where = "first mismatch at position " + std::to_string(first) + ": expected " + std::to_string(wi[first]) +
                        " " + piece(tok, wi[first]) + ", got " + (first < gi.size() ? std::to_string(gi[first]) + " " + piece(tok, gi[first]) : "nothing") +
                        "; expected text: \"" + around(tok, wi, first) + "\", got: \"" + (first < gi.size() ? around(tok, gi, first) : "") + "\"";
    const bool near_tie = first < gi.size() && step < wd.at("top_ids").size() && step < gd["top_ids"].size() &&
                          in(gd["top_ids"][step], wi[first], kNearTieTopN) && in(wd.at("top_ids").at(step), gi[first], kNearTieTopN);
    if (same_env || !near_tie) {
      r.status = Status::Fail;
      r.detail = where + "; " + fig + (same_env ? " (same environment: tokens must be exact)" : " (not a near-tie)");
    } else if (r.ok()) {
      r.detail = "accepted near-tie divergence in another environment: " + where;
    }
    return r;
  }
  if (r.ok()) r.detail = std::to_string(wi.size() - t0) + " tokens identical, " + fig;
  return r;
}

}  // namespace

nlohmann::json Provenance::to_json() const {
  return {{"commit", commit}, {"libtorch", libtorch}, {"device", device}, {"dtype", dtype},
          {"threads", threads}, {"cpu", cpu},       {"blas", blas},     {"seed", seed}};
}

Provenance Provenance::from_json(const nlohmann::json& j) {
  Provenance p;
  p.commit = j.at("commit");
  p.libtorch = j.at("libtorch");
  p.device = j.at("device");
  p.dtype = j.at("dtype");
  p.threads = static_cast<int>(integer(j.at("threads"), "threads"));
  p.cpu = j.value("cpu", "unknown");
  if (j.contains("blas") && j["blas"].is_string()) p.blas = j["blas"];
  p.seed = static_cast<uint64_t>(integer(j.at("seed"), "seed"));
  return p;
}

bool Provenance::same_environment(const Provenance& o) const {
  return libtorch == o.libtorch && device == o.device && dtype == o.dtype && threads == o.threads && cpu == o.cpu &&
         (blas.empty() || o.blas.empty() || blas == o.blas);
}

nlohmann::json read_golden_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": golden file missing (run `tinygpt golden update`)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON (" + e.what() + ")");
  }
}

void validate_golden_document(const std::string& path, const nlohmann::json& want, const Tokenizer& tok) {
  try {  // every field compare_golden_document reads from a recorded file, with its type
    Provenance::from_json(want.at("provenance"));
    want.at("case").get<std::string>();
    if (want.contains("model")) want.at("model").get<std::string>();
    if (want.contains("rows")) {
      for (const auto& row : want.at("rows")) {
        row.at("name").get<std::string>();
        integer(row.at("prompt_len"), "prompt_len");
        for (const int64_t id : integers(row.at("ids"), "ids"))
          if (id < 0 || id >= tok.vocab_size())
            throw Malformed("ids: id " + std::to_string(id) + " outside [0, " + std::to_string(tok.vocab_size()) + ")");
        const auto& d = row.at("digest");
        for (const auto& step : d.at("top_ids")) integers(step, "top_ids");
        for (const auto& step : d.at("top_logits"))
          for (const auto& x : step)
            if (!x.is_number()) throw Malformed("top_logits must be numbers, got " + x.dump().substr(0, 40));
      }
    } else {
      for (const auto& item : want.at("items")) {
        item.at("name").get<std::string>();
        integers(item.at("draws"), "draws");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": malformed golden file (" + e.what() + ")");
  } catch (const Malformed& e) {
    throw InputError(path + ": malformed golden file (" + e.what() + ")");
  }
}

std::vector<CheckResult> compare_golden_document(const std::string& path, const nlohmann::json& want,
                                                      const nlohmann::json& fresh, const Tokenizer& tok,
                                                      const std::string& suffix, bool cached_only) {
  std::vector<CheckResult> out;
  try {  // a recorded file with fields missing or of the wrong type is named, not a crash
    const bool same = Provenance::from_json(want.at("provenance")).same_environment(Provenance::from_json(fresh.at("provenance")));
    const std::string c = want.at("case");
    if (want.contains("model") && want.at("model") != fresh["model"]) {
      out.push_back(golden_row(c + suffix, false, "recorded for another model (weights digest " + want.at("model").get<std::string>() +
                                               ", this model's " + fresh["model"].get<std::string>() + ")"));
      return out;
    }
    if (want.contains("rows")) {
      // Fresh rows by name: another cache recomputes only the cached rows.
      for (const auto& got : fresh["rows"]) {
        const std::string name = got["name"];
        const nlohmann::json* w = nullptr;
        for (const auto& row : want.at("rows"))
          if (row.at("name") == name) w = &row;
        if (!w) {
          out.push_back(golden_row(c + "/" + name + suffix, false, "no recorded golden for this case (run `tinygpt golden update`)"));
          continue;
        }
        out.push_back(compare_trace(c + "/" + name + suffix, *w, got, same, tok));
      }
      for (const auto& row : want.at("rows")) {
        bool computed = false;
        for (const auto& got : fresh["rows"]) computed |= got["name"] == row.at("name");
        if (!computed && !cached_only)
          out.push_back(golden_row(c + "/" + row.at("name").get<std::string>(), false, "recorded but no longer computed"));
      }
    } else {
      for (size_t i = 0; i < want.at("items").size(); ++i) {
        const auto& w = want.at("items").at(i);
        const auto& g = fresh["items"].at(i);
        CheckResult r = golden_row(c + "/" + w.at("name").get<std::string>(), g["passed"].get<bool>(), "");
        if (!r.ok()) r.detail = "the self-check itself fails: " + g.value("detail", std::string("?"));
        else if (same && w.at("draws") != g["draws"]) {
          r.status = Status::Fail;
          const auto wd = integers(w.at("draws"), "draws"), gd = g["draws"].get<std::vector<int64_t>>();
          size_t k = 0;
          while (k < std::min(wd.size(), gd.size()) && wd[k] == gd[k]) ++k;
          r.detail = "draw " + std::to_string(k) + " differs: expected " + (k < wd.size() ? std::to_string(wd[k]) : "none") +
                     ", got " + (k < gd.size() ? std::to_string(gd[k]) : "none");
        } else {
          r.detail = !same ? "invariants hold (draws not compared across environments)"
                     : w.at("draws").empty() ? "holds (no draws recorded)" : std::to_string(w.at("draws").size()) + " draws identical";
        }
        out.push_back(r);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": malformed golden file (" + e.what() + ")");
  } catch (const Malformed& e) {
    throw InputError(path + ": malformed golden file (" + e.what() + ")");
  }
  return out;
}

}  // namespace tinygpt::checks
