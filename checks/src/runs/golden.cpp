#include "tinygpt/checks/golden.h"

#include <algorithm>

#include "tinygpt/checks/golden_compare.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "paths.h"
#include "tinygpt/checks/sample_grid.h"
#include "tinygpt/laws/selfcheck.h"
#include "tinygpt/blas.h"
#include "tinygpt/device.h"
#include "tinygpt/errors.h"
#include "tinygpt/generate.h"
#include "tinygpt/checkpoint.h"

namespace tinygpt::checks {

namespace fs = std::filesystem;

namespace {

constexpr const char* kGridPrompt = "And God said";
constexpr int64_t kGridTokens = 60;
constexpr int64_t kGreedyTokens = 600;

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
  const at::Tensor prompt = main_prompt(dev);
  nlohmann::json rows = nlohmann::json::array();
  for (bool cached : {true, false}) {
    if (!cached && !with_uncached) continue;
    Recorder keep;
    at::Tensor out, steps;  // (1, 3 + n) and (1, n, V)
    if (cached) {
      Decoder d = variant.decoder(fx.model->config());
      out = generate_cached(fx.model, prompt, kGreedyTokens, greedy(), *d.cache, d.path, keep.observer());
      steps = keep.stacked();
    } else if (uncached) {  // the same uncached run, already computed by the caller
      out = uncached->uncached;
      steps = uncached->uncached_logits;
    } else {
      out = generate_uncached(fx.model, prompt, kGreedyTokens, greedy(), keep.observer());
      steps = keep.stacked();
    }
    std::vector<at::Tensor> logits;
    for (int64_t i = 0; i < steps.size(1); ++i) logits.push_back(steps[0][i].to(at::kCPU));
    at::Tensor o = out[0].to(at::kCPU);
    rows.push_back(trace(cached ? "cached" : "uncached", std::vector<int64_t>(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel()),
                         prompt.size(1), logits, fx.tokenizer));
  }
  return rows;
}

nlohmann::json envelope(const std::string& name, c10::Device dev, uint64_t seed, const std::string& model) {
  return {{"case", name},
          {"model", model},
          {"provenance", current_provenance(dev, seed).to_json()},
          {"tolerance", {{"logit_digest", kDigestTolerance}, {"reason", kDigestToleranceReason},
                         {"tokens", "exact on the same libtorch, device, dtype, threads and cpu; elsewhere a divergence only at a near-tie (each side's token in the other's top 2)"}}}};
}

}  // namespace

Provenance current_provenance(c10::Device device, uint64_t seed) {
  Provenance p;
  p.commit = git_commit();
  p.libtorch = libtorch_version();
  p.device = device.str();
  p.threads = at::get_num_threads();
  p.cpu = device.is_cuda() ? "n/a" : cpu_model();
  p.blas = device.is_cuda() ? "n/a" : blas_info().core;
  p.seed = seed;
  return p;
}

Fixture load_fixture(const std::string& dir, c10::Device device) {
  return load_fixture((fs::path(dir) / "fixture.safetensors").string(), (fs::path(dir) / "tokenizer.json").string(), dir,
                      device);
}

Fixture load_fixture(const std::string& checkpoint, const std::string& tokenizer, const std::string& golden_dir,
                     c10::Device device) {
  Fixture fx;
  fx.dir = golden_dir;
  fx.model = load_checkpoint(checkpoint, device);
  fx.tokenizer = Tokenizer::load(tokenizer);
  fx.tokenizer.check_serves(fx.model->config().vocab_size, tokenizer);
  const fs::path draft = fs::path(golden_dir) / "draft.safetensors";
  if (!golden_dir.empty() && fs::exists(draft)) {
    GPT d = load_checkpoint(draft.string(), device);
    if (d->config().vocab_size == fx.model->config().vocab_size) fx.draft = d;  // another model's goldens: not its draft
  }
  return fx;
}

const std::vector<std::string>& golden_cases() {
  static const std::vector<std::string> c = {"sample-grid", "greedy-600", "sampler-selfcheck"};
  return c;
}

namespace {
// The file each case is recorded in.
std::string golden_file(const std::string& c) {
  std::string f = c;
  std::replace(f.begin(), f.end(), '-', '_');
  return f + ".json";
}

void check_cases(const std::vector<std::string>& cases) {
  for (const auto& c : cases)
    if (std::find(golden_cases().begin(), golden_cases().end(), c) == golden_cases().end())
      throw std::invalid_argument("golden: no case '" + c + "' (the cases: sample-grid, greedy-600, sampler-selfcheck)");
}
}  // namespace

std::vector<std::pair<std::string, nlohmann::json>> compute_goldens(Fixture& fx, c10::Device dev,
                                                                   const CacheVariant* variant, const Reference* uncached,
                                                                   const std::vector<std::string>& cases) {
  check_cases(cases);
  auto want = [&](const char* c) { return cases.empty() || std::find(cases.begin(), cases.end(), c) != cases.end(); };
  // The uncached 600-token run, when the caller has none, from the reference cache where it holds one
  // (TINYGPT_REFERENCE_CACHE: the same build's own run on these weights and this prompt, stored bit for
  // bit); otherwise greedy_rows computes it, as before the cache existed. Nothing is stored from here.
  std::optional<Reference> kept;
  if (!uncached && want("greedy-600")) {
    kept = load_cached_reference(fx.model, main_prompt(dev), kGreedyTokens);
    if (kept) uncached = &*kept;
  }
  if (uncached) {
    const at::Tensor want = main_prompt();
    const int64_t T0 = want.size(1);
    if (uncached->uncached.size(0) != 1 || uncached->uncached.size(1) != T0 + kGreedyTokens ||
        !uncached->uncached.narrow(1, 0, T0).to(at::kCPU).equal(want))
      throw std::invalid_argument("goldens: the reused uncached run must be ids [1, 2, 3] and " +
                                  std::to_string(kGreedyTokens) + " greedy tokens");
  }
  at::NoGradGuard no_grad;
  const bool recorded = variant == nullptr;  // the recorded set: every case, through the series' cache
  if (!variant) variant = &cache_registry().get(kSeriesCache);
  const std::string digest = model_digest(fx.model);
  std::vector<std::pair<std::string, nlohmann::json>> files;
  if (want("sample-grid")) {
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
  if (want("greedy-600")) {
    nlohmann::json doc = envelope("greedy-600", dev, 0, digest);
    const at::Tensor p = main_prompt().contiguous();
    doc["prompt_ids"] = std::vector<int64_t>(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
    doc["rows"] = greedy_rows(fx, dev, *variant, recorded, uncached);
    files.emplace_back("greedy_600.json", doc);
  }
  if (recorded && want("sampler-selfcheck")) {
    nlohmann::json doc = envelope("sampler-selfcheck", dev, 0, digest);
    doc["items"] = nlohmann::json::array();
    std::vector<std::vector<int64_t>> draws;
    const auto items = props::seed_selfcheck(props::production_sampler().pick, dev, &draws);
    for (size_t i = 0; i < items.size(); ++i)
      doc["items"].push_back({{"name", items[i].name}, {"passed", items[i].ok()}, {"detail", items[i].detail}, {"draws", draws[i]}});
    files.emplace_back("sampler_selfcheck.json", doc);
  }
  return files;
}

std::vector<CheckResult> verify_goldens(Fixture& fx, c10::Device dev, const CacheVariant* variant,
                                             const Reference* uncached, const std::vector<std::string>& cases) {
  check_cases(cases);
  std::vector<CheckResult> out;
  const std::string suffix = variant ? " [" + variant->name + "]" : "";
  // Every recorded file is read and its fields checked before the minutes of computing: a missing or broken one
  // is named at once.
  for (const auto& c : cases.empty() ? golden_cases() : cases) {
    const std::string path = (fs::path(fx.dir) / golden_file(c)).string();
    validate_golden_document(path, read_golden_json(path), fx.tokenizer);
  }
  for (const auto& [file, fresh] : compute_goldens(fx, dev, variant, uncached, cases)) {
    const std::string path = (fs::path(fx.dir) / file).string();
    for (auto& r : compare_golden_document(path, read_golden_json(path), fresh, fx.tokenizer, suffix, variant != nullptr))
      out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> update_goldens(Fixture& fx, c10::Device dev) {
  std::vector<std::string> lines;
  for (const auto& [file, fresh] : compute_goldens(fx, dev)) {
    const fs::path p = fs::path(fx.dir) / file;
    std::string what = "new";
    if (fs::exists(p)) {
      const nlohmann::json old = read_golden_json(p.string());
      nlohmann::json a = old, b = fresh;
      a.erase("provenance");
      b.erase("provenance");
      if (a == b) what = "unchanged (provenance refreshed)";
      else {
        what = "changed:";
        try {  // the old file is the user's: any shape at all, so every lookup is checked
          if (old.contains("rows") && fresh.contains("rows")) {
            for (size_t i = 0; i < std::min(old.at("rows").size(), fresh["rows"].size()); ++i) {
              const auto& o = old.at("rows").at(i);
              const std::string name = fresh["rows"][i]["name"];
              if (!o.is_object() || !o.contains("ids") || o.at("ids") != fresh["rows"][i]["ids"]) what += " " + name + " ids;";
              else if (o != fresh["rows"][i]) what += " " + name + " logits;";
            }
          }
          if (old.contains("items") && old.at("items") != fresh["items"]) what += " draws;";
        } catch (const nlohmann::json::exception&) {
          what = "changed (the old file was malformed)";
        }
      }
    }
    write_json_atomically(p.string(), fresh);
    lines.push_back(file + ": " + what);
  }
  return lines;
}

}  // namespace tinygpt::checks
