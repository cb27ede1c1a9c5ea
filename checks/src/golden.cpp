#include "tinygpt/checks/golden.h"

#include "bench.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "paths.h"
#include "report.h"
#include "sample_grid.h"
#include "tinygpt/checks/selfcheck.h"
#include "tinygpt/device.h"
#include "tinygpt/errors.h"
#include "tinygpt/generate.h"
#include "tinygpt/safetensors.h"

namespace tinygpt::checks {

namespace fs = std::filesystem;

namespace {

constexpr const char* kGridPrompt = "And God said";
constexpr int64_t kGridTokens = 60;
constexpr int64_t kGreedyTokens = 600;
constexpr int kDigestTop = 5;

}  // namespace

std::string git_commit() {
  std::string out;
  if (FILE* f = popen(("git -C " + std::string(TINYGPT_SOURCE_DIR) + " rev-parse --short=12 HEAD 2>/dev/null").c_str(), "r")) {
    char buf[64] = {0};
    if (fgets(buf, sizeof buf, f)) out = buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

namespace {


// Per-step digest: the top-5 ids and their logits.
nlohmann::json digest(const std::vector<at::Tensor>& logits) {
  nlohmann::json ids = nlohmann::json::array(), vals = nlohmann::json::array();
  for (const auto& l : logits) {
    auto [v, i] = l.to(at::kFloat).topk(kDigestTop);
    ids.push_back(std::vector<int64_t>(i.data_ptr<int64_t>(), i.data_ptr<int64_t>() + kDigestTop));
    vals.push_back(std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + kDigestTop));
  }
  return {{"top_ids", ids}, {"top_logits", vals}};
}

nlohmann::json settings_json(const SamplingSettings& s) {
  return {{"temperature", s.temperature}, {"top_k", s.top_k}, {"top_p", s.top_p}, {"penalty", s.penalty}};
}

nlohmann::json trace(const std::string& name, const std::vector<int64_t>& ids, int64_t prompt_len,
                     const std::vector<at::Tensor>& logits, const Tokenizer& tok) {
  nlohmann::json j = {{"name", name}, {"prompt_len", prompt_len}, {"ids", ids}, {"text", tok.decode(ids)}};
  j["digest"] = digest(logits);
  return j;
}

// The greedy 600-token runs from ids [1, 2, 3], with per-step logits: cached through `variant`,
// and uncached when `with_uncached`.
nlohmann::json greedy_rows(Fixture& fx, c10::Device dev, const CacheVariant& variant, bool with_uncached,
                           const Reference* uncached) {
  at::Tensor prompt = at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong).unsqueeze(0).to(dev);
  nlohmann::json rows = nlohmann::json::array();
  for (bool cached : {true, false}) {
    if (!cached && !with_uncached) continue;
    std::vector<at::Tensor> logits;
    StepObserver keep = [&](int64_t, const at::Tensor& l) { logits.push_back(l[0].to(at::kCPU).clone()); };
    auto cache = variant.make_cache(fx.model->config());
    at::Tensor out;
    if (cached) {
      out = generate_cached(fx.model, prompt, kGreedyTokens, greedy(), *cache, variant.path(), keep);
    } else if (uncached) {  // the same uncached run, already computed by the caller
      out = uncached->uncached;
      for (int64_t i = 0; i < kGreedyTokens; ++i) keep(i, uncached->uncached_logits.select(1, i));
    } else {
      out = generate_uncached(fx.model, prompt, kGreedyTokens, greedy(), keep);
    }
    at::Tensor o = out[0].to(at::kCPU);
    rows.push_back(trace(cached ? "cached" : "uncached", std::vector<int64_t>(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel()),
                         3, logits, fx.tokenizer));
  }
  return rows;
}

nlohmann::json envelope(const std::string& name, c10::Device dev, uint64_t seed, const std::string& model) {
  return {{"case", name},
          {"model", model},
          {"provenance", Provenance::current(dev, seed).to_json()},
          {"tolerance", {{"logit_digest", kDigestTolerance}, {"reason", kDigestToleranceReason},
                         {"tokens", "exact on the same libtorch, device, dtype, threads and cpu; elsewhere a divergence only at a near-tie (each side's token in the other's top 2)"}}}};
}

// Text around position p of ids: a few tokens either side, decoded.
std::string around(const Tokenizer& tok, const std::vector<int64_t>& ids, size_t p) {
  const size_t lo = p >= 8 ? p - 8 : 0, hi = std::min(ids.size(), p + 4);
  return tok.decode(std::vector<int64_t>(ids.begin() + lo, ids.begin() + hi));
}

std::string piece(const Tokenizer& tok, int64_t id) { return "'" + tok.decode({id}) + "'"; }

bool in(const nlohmann::json& arr, int64_t id, int n) {
  for (int k = 0; k < n && k < static_cast<int>(arr.size()); ++k)
    if (arr[k].get<int64_t>() == id) return true;
  return false;
}

// Compares one recorded trace with a fresh one.
GoldenCaseResult compare_trace(const std::string& name, const nlohmann::json& want, const nlohmann::json& got,
                               bool same_env, const Tokenizer& tok) {
  GoldenCaseResult r{name, true, "", 0};
  if (got.contains("error")) {
    r.passed = false;
    r.detail = "error: " + got["error"].get<std::string>();
    return r;
  }
  const auto wi = want.at("ids").get<std::vector<int64_t>>(), gi = got.at("ids").get<std::vector<int64_t>>();
  const int64_t t0 = want.at("prompt_len").get<int64_t>();
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
          r.worst_logit_diff = std::max(r.worst_logit_diff, std::abs(wd.at("top_logits").at(s).at(k).get<double>() - gd["top_logits"][s][m].get<double>()));
  }
  char fig[96];
  std::snprintf(fig, sizeof fig, "largest logit diff %.2e", r.worst_logit_diff);
  if (r.worst_logit_diff > kDigestTolerance) {
    r.passed = false;
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
      r.passed = false;
      r.detail = where + "; " + fig + (same_env ? " (same environment: tokens must be exact)" : " (not a near-tie)");
    } else if (r.passed) {
      r.detail = "accepted near-tie divergence in another environment: " + where;
    }
    return r;
  }
  if (r.passed) r.detail = std::to_string(wi.size() - t0) + " tokens identical, " + fig;
  return r;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw InputError(p.string() + ": golden file missing (run `tinygpt golden update`)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

nlohmann::json Provenance::to_json() const {
  return {{"commit", commit}, {"libtorch", libtorch}, {"device", device}, {"dtype", dtype},
          {"threads", threads}, {"cpu", cpu},       {"seed", seed}};
}

Provenance Provenance::from_json(const nlohmann::json& j) {
  Provenance p;
  p.commit = j.at("commit");
  p.libtorch = j.at("libtorch");
  p.device = j.at("device");
  p.dtype = j.at("dtype");
  p.threads = j.at("threads");
  p.cpu = j.value("cpu", "unknown");
  p.seed = j.at("seed");
  return p;
}

Provenance Provenance::current(c10::Device device, uint64_t seed) {
  Provenance p;
  p.commit = git_commit();
  p.libtorch = libtorch_version();
  p.device = device.str();
  p.threads = at::get_num_threads();
  p.cpu = device.is_cuda() ? "n/a" : cpu_model();
  p.seed = seed;
  return p;
}

bool Provenance::same_environment(const Provenance& o) const {
  return libtorch == o.libtorch && device == o.device && dtype == o.dtype && threads == o.threads && cpu == o.cpu;
}

Fixture load_fixture(const std::string& dir, c10::Device device) {
  return load_fixture((fs::path(dir) / "fixture.safetensors").string(), (fs::path(dir) / "tokenizer.json").string(), dir,
                      device);
}

Fixture load_fixture(const std::string& checkpoint, const std::string& tokenizer, const std::string& golden_dir,
                     c10::Device device) {
  Fixture fx;
  fx.dir = golden_dir;
  Checkpoint c = read_any_checkpoint(checkpoint);
  fx.model = GPT(c.config, 0);
  try {
    load_weights(fx.model, c.tensors);
  } catch (const std::exception& e) {
    throw InputError(checkpoint + ": " + e.what());
  }
  fx.model->to(device);
  fx.model->eval();
  fx.tokenizer = Tokenizer::load(tokenizer);
  if (fx.tokenizer.vocab_size() != c.config.vocab_size)
    throw std::invalid_argument(tokenizer + ": vocabulary " + std::to_string(fx.tokenizer.vocab_size()) + " != the model's " +
                                std::to_string(c.config.vocab_size));
  return fx;
}

std::string model_digest(GPT& model) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (const auto& [name, t] : model->state_dict()) {
    if (name == "head.weight") continue;  // the embedding, again
    at::Tensor c = t.detach().to(at::kCPU).to(at::kFloat).contiguous();
    const auto* p = reinterpret_cast<const unsigned char*>(c.data_ptr<float>());
    for (int64_t i = 0; i < c.numel() * 4; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

std::vector<std::pair<std::string, nlohmann::json>> compute_goldens(Fixture& fx, c10::Device dev,
                                                                   const CacheVariant* variant, const Reference* uncached) {
  if (uncached) {
    const at::Tensor want = at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong).unsqueeze(0);
    if (uncached->uncached.size(0) != 1 || uncached->uncached.size(1) != 3 + kGreedyTokens ||
        !uncached->uncached.narrow(1, 0, 3).to(at::kCPU).equal(want))
      throw std::invalid_argument("goldens: the reused uncached run must be ids [1, 2, 3] and " +
                                  std::to_string(kGreedyTokens) + " greedy tokens");
  }
  at::NoGradGuard no_grad;
  const bool recorded = variant == nullptr;  // the recorded set: every case, through the series' cache
  if (!variant) variant = &cache_registry().get("rolling");
  const std::string digest = model_digest(fx.model);
  std::vector<std::pair<std::string, nlohmann::json>> files;
  {
    nlohmann::json doc = envelope("sample-grid", dev, 1, digest);
    const auto prompt = fx.tokenizer.encode(kGridPrompt);
    doc["prompt"] = kGridPrompt;
    doc["tokens"] = kGridTokens;
    doc["rows"] = nlohmann::json::array();
    for (const auto& row : sample_grid(fx.model, fx.tokenizer, prompt, 1, kGridTokens, /*keep_logits=*/true, variant)) {
      auto t = trace(row.name, row.ids, static_cast<int64_t>(prompt.size()), row.logits, fx.tokenizer);
      t["settings"] = settings_json(row.settings);
      if (!row.error.empty()) t["error"] = row.error;
      doc["rows"].push_back(t);
    }
    files.emplace_back("sample_grid.json", doc);
  }
  {
    nlohmann::json doc = envelope("greedy-600", dev, 0, digest);
    doc["prompt_ids"] = {1, 2, 3};
    doc["rows"] = greedy_rows(fx, dev, *variant, recorded, uncached);
    files.emplace_back("greedy_600.json", doc);
  }
  if (recorded) {
    nlohmann::json doc = envelope("sampler-selfcheck", dev, 0, digest);
    doc["items"] = nlohmann::json::array();
    for (const auto& it : sampler_selfcheck(production_pick(), dev))
      doc["items"].push_back({{"name", it.name}, {"passed", it.passed}, {"detail", it.detail}, {"draws", it.draws}});
    files.emplace_back("sampler_selfcheck.json", doc);
  }
  return files;
}

std::vector<GoldenCaseResult> verify_goldens(Fixture& fx, c10::Device dev, const CacheVariant* variant,
                                             const Reference* uncached) {
  std::vector<GoldenCaseResult> out;
  const std::string suffix = variant ? " [" + variant->name + "]" : "";
  // Every recorded file is read once before the minutes of computing: a missing or broken one
  // is named at once.
  for (const char* f : {"greedy_600.json", "sample_grid.json", "sampler_selfcheck.json"}) read_json(fs::path(fx.dir) / f);
  for (const auto& [file, fresh] : compute_goldens(fx, dev, variant, uncached)) {
    const nlohmann::json want = read_json(fs::path(fx.dir) / file);
    try {  // a recorded file with fields missing or of the wrong type is named, not a crash
    const bool same = Provenance::from_json(want.at("provenance")).same_environment(Provenance::from_json(fresh.at("provenance")));
    const std::string c = want.at("case");
    if (want.contains("model") && want.at("model") != fresh["model"]) {
      out.push_back({c + suffix, false, "recorded for another model (weights digest " + want.at("model").get<std::string>() +
                                            ", this model's " + fresh["model"].get<std::string>() + ")", 0});
      continue;
    }
    if (want.contains("rows")) {
      // Fresh rows by name: another cache recomputes only the cached rows.
      for (const auto& got : fresh["rows"]) {
        const std::string name = got["name"];
        const nlohmann::json* w = nullptr;
        for (const auto& row : want.at("rows"))
          if (row.at("name") == name) w = &row;
        if (!w) {
          out.push_back({c + "/" + name + suffix, false, "no recorded golden for this case (run `tinygpt golden update`)", 0});
          continue;
        }
        out.push_back(compare_trace(c + "/" + name + suffix, *w, got, same, fx.tokenizer));
      }
      for (const auto& row : want.at("rows")) {
        bool computed = false;
        for (const auto& got : fresh["rows"]) computed |= got["name"] == row.at("name");
        if (!computed && !variant)
          out.push_back({c + "/" + row.at("name").get<std::string>(), false, "recorded but no longer computed", 0});
      }
    } else {
      for (size_t i = 0; i < want.at("items").size(); ++i) {
        const auto& w = want.at("items").at(i);
        const auto& g = fresh["items"].at(i);
        GoldenCaseResult r{c + "/" + w.at("name").get<std::string>(), g["passed"].get<bool>(), "", 0};
        if (!r.passed) r.detail = "the self-check itself fails: " + g.value("detail", std::string("?"));
        else if (same && w.at("draws") != g["draws"]) {
          r.passed = false;
          const auto wd = w.at("draws").get<std::vector<int64_t>>(), gd = g["draws"].get<std::vector<int64_t>>();
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
      throw InputError((fs::path(fx.dir) / file).string() + ": malformed golden file (" + e.what() + ")");
    }
  }
  return out;
}

std::vector<std::string> update_goldens(Fixture& fx, c10::Device dev) {
  std::vector<std::string> lines;
  for (const auto& [file, fresh] : compute_goldens(fx, dev)) {
    const fs::path p = fs::path(fx.dir) / file;
    std::string what = "new";
    if (fs::exists(p)) {
      const nlohmann::json old = read_json(p);
      nlohmann::json a = old, b = fresh;
      a.erase("provenance");
      b.erase("provenance");
      if (a == b) what = "unchanged (provenance refreshed)";
      else {
        what = "changed:";
        if (old.contains("rows") && fresh.contains("rows")) {
          for (size_t i = 0; i < std::min(old["rows"].size(), fresh["rows"].size()); ++i) {
            if (old["rows"][i]["ids"] != fresh["rows"][i]["ids"]) {
              what += " " + fresh["rows"][i]["name"].get<std::string>() + " ids;";
            } else if (old["rows"][i] != fresh["rows"][i]) {
              what += " " + fresh["rows"][i]["name"].get<std::string>() + " logits;";
            }
          }
        }
        if (old.contains("items") && old["items"] != fresh["items"]) what += " draws;";
      }
    }
    write_json_atomically(p.string(), fresh);
    lines.push_back(file + ": " + what);
  }
  return lines;
}

}  // namespace tinygpt::checks
