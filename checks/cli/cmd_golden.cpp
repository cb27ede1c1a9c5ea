// `tinygpt sample-grid`, `tinygpt golden verify|update` and `tinygpt verify`, the main job.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "report_files.h"
#include "commands.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/checks/inject.h"
#include "tinygpt/checks/parallel_runs.h"
#include "model_source.h"
#include "tinygpt/checks/data.h"
#include "report.h"
#include "sample_grid.h"
#include "tinygpt/checks/selfcheck.h"
#include "tinygpt/errors.h"

namespace tinygpt::cli {

namespace {

// The golden folder and model a command works on: the shipped fixture unless --checkpoint names
// another model (its tokenizer from --tokenizer or <dir>/tokenizer.json; its goldens in --dir).
struct FixtureOptions {
  std::string dir, checkpoint, tokenizer;
  void add(CLI::App* cmd, const char* dir_help) {
    cmd->add_option("--dir", dir, dir_help);
    cmd->add_option("--checkpoint", checkpoint, "another model (.pt or .safetensors) instead of the shipped fixture")
        ->check(CLI::ExistingFile);
    cmd->add_option("--tokenizer", tokenizer, "its tokenizer.json (default: <dir>/tokenizer.json)")->check(CLI::ExistingFile);
  }
  bool shipped() const { return checkpoint.empty(); }
  // Throws std::invalid_argument when a custom model has no tokenizer to use.
  checks::Fixture load(c10::Device dev, bool need_dir) const {
    if (shipped()) return checks::load_fixture(dir.empty() ? checks::data_dir() : dir, dev);
    if (need_dir && dir.empty()) throw std::invalid_argument("--checkpoint needs --dir: the folder of that model's golden files");
    const std::string tok = !tokenizer.empty() ? tokenizer : dir.empty() ? "" : dir + "/tokenizer.json";
    if (tok.empty() || !std::ifstream(tok)) throw std::invalid_argument("--checkpoint needs --tokenizer (or a tokenizer.json in --dir)");
    return checks::load_fixture(checkpoint, tok, dir, dev);
  }
};

// One summary row for a production cache's equivalence run: the seed's figure and the worst
// logit difference, or the first failing check.
checks::VerifyRow equivalence_row(const checks::EquivalenceResult& c, const std::string& what) {
  double seconds = 0;
  for (const auto& s : c.checks) seconds += s.seconds;
  std::string fig = "first " + std::to_string(std::min(c.identical_prefix, c.must_match)) + " of " +
                    std::to_string(c.must_match) + " tokens identical";
  if (c.first_difference) fig += ", first difference at " + std::to_string(*c.first_difference) + " of " + std::to_string(c.sequence_length);
  char b[128];
  std::snprintf(b, sizeof b, "; worst logit diff %.1e (tol %.0e); %zu checks", std::max(c.loop_band.worst, c.forced_band.worst),
                c.tolerance, c.checks.size());
  fig += b;
  for (const auto& s : c.checks)
    if (!s.passed) {
      fig = s.name + ": " + s.detail;
      break;
    }
  return {"cache-equivalence [" + c.cache + what + "]", c.passed(), fig, seconds};
}

struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

}  // namespace

Command add_sample_grid(CLI::App& app) {
  struct Opts {
    RunOptions run;
    ModelSource model;
    std::string tokenizer, prompt = "And God said", json;
    uint64_t seed = 1;
    int64_t tokens = 60;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("sample-grid",
                                     "The seed's sample grid: one prompt under nine sampler settings (the seed's eight and\n"
                                     "one with every stage active), the seed re-set before each row (cached). Defaults to\n"
                                     "the shipped fixture and its tokenizer.");
  add_model_options(cmd, o->model);
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: the shipped fixture's)")->check(CLI::ExistingFile);
  cmd->add_option("--prompt", o->prompt, "prompt text")->capture_default_str();
  cmd->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "new tokens per row")->capture_default_str()->check(kPositive);
  cmd->add_option("--json", o->json, "write rows (settings, ids, text) here");
  add_run_options(cmd, o->run);
  return {cmd, [o] {
            const c10::Device dev = apply_run_options(o->run);
            if (o->model.checkpoint.empty()) o->model.checkpoint = checks::data_dir() + "/fixture.safetensors";
            if (o->tokenizer.empty()) o->tokenizer = checks::data_dir() + "/tokenizer.json";
            GPT model = load_model(o->model, dev);
            Tokenizer tok = Tokenizer::load(o->tokenizer);
            const auto ids = tok.encode(o->prompt);
            if (ids.empty()) throw std::invalid_argument("--prompt encodes to no tokens");
            nlohmann::json rows = nlohmann::json::array();
            for (const auto& r : checks::sample_grid(model, tok, ids, o->seed, o->tokens)) {
              std::cout << "--- " << r.name << "\n" << r.text << "\n\n";
              rows.push_back({{"name", r.name}, {"settings", r.settings.to_string()}, {"ids", r.ids}, {"text", r.text}});
            }
            if (!o->json.empty())
              checks::write_json_atomically(o->json, {{"prompt", o->prompt}, {"seed", o->seed}, {"tokens", o->tokens}, {"rows", rows}});
            return int(kOk);
          }};
}

Command add_golden(CLI::App& app) {
  auto fo = std::make_shared<FixtureOptions>();
  auto run = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("golden", "Compare with, or record, the golden outputs of the shipped fixture (or of --checkpoint)");
  cmd->require_subcommand(1);
  CLI::App* verify = cmd->add_subcommand("verify", "Recompute every golden case and report each as passed or failed");
  CLI::App* update = cmd->add_subcommand("update", "Record the golden files (atomically) and print what changed; refused when CI=true");
  for (CLI::App* c : {verify, update}) {
    fo->add(c, "golden folder (default: the shipped fixture's; required with --checkpoint)");
    add_run_options(c, *run);
  }
  return {cmd, [fo, run, verify] {
            const char* ci = std::getenv("CI");
            if (!verify->parsed() && ci && std::string(ci) == "true")
              throw std::invalid_argument("golden update refused: CI=true (goldens change only by a deliberate local run)");
            const c10::Device dev = apply_run_options(*run);
            checks::Fixture fx = fo->load(dev, /*need_dir=*/true);
            if (!verify->parsed()) {
              for (const auto& l : checks::update_goldens(fx, dev)) std::cout << l << "\n";
              return int(kOk);
            }
            bool ok = true;
            for (const auto& r : checks::verify_goldens(fx, dev)) {
              std::cout << (r.passed ? "PASS " : "FAIL ") << r.name << ": " << r.detail << "\n";
              ok &= r.passed;
            }
            std::cout << (ok ? "golden: all cases passed\n" : "golden: FAILED\n");
            return ok ? int(kOk) : int(kCheckFailed);
          }};
}

Command add_verify(CLI::App& app) {
  struct Opts {
    RunOptions run;
    FixtureOptions fixture;
    std::string json = "tinygpt-verify.json", junit;
    int64_t tokens = 600;
    std::string faults = "all";
    ReportFiles report;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "The main job, no arguments needed: on the shipped fixture, every production cache (and any registered\n"
      "one) through every equivalence check at batch 1 and at a batch of three prompts, the fault matrix, the\n"
      "goldens through every production cache, and the sampler self-check. With --checkpoint, the same on\n"
      "your model (goldens when --dir holds golden files recorded for it: `tinygpt golden update --dir D\n"
      "--checkpoint F --tokenizer T`). Prints one summary table, writes a JSON report (and JUnit XML with\n"
      "--junit), exits 1 on any failure. Independent runs (the fault matrix's, the batch of three, the\n"
      "goldens per cache) go side by side on the CPU, one per --threads, each on one thread.");
  o->fixture.add(cmd, "golden folder (default: the shipped fixture's)");
  cmd->add_option("--json", o->json, "JSON report path")->capture_default_str();
  cmd->add_option("--junit", o->junit, "also write JUnit XML here");
  cmd->add_option("--tokens", o->tokens, "greedy tokens for the cache checks")->capture_default_str()->check(kPositive);
  cmd->add_option("--faults", o->faults,
                  "faults for the fault matrix: all, none, or names, comma-separated (`tinygpt inject --help` lists them)")
      ->capture_default_str();
  o->report.add(cmd, /*bench=*/true);
  add_run_options(cmd, o->run);
  return {cmd, [o] {
            const c10::Device dev = apply_run_options(o->run);
            const nlohmann::json bench = read_bench_json(o->report.bench_json);  // a bad file fails before the run
            std::vector<const checks::CacheVariant*> faults;  // named faults are checked before the run too
            if (o->faults == "all") {
              faults = checks::cache_registry().all(/*faults=*/true);
            } else if (o->faults != "none") {
              std::stringstream names(o->faults);
              for (std::string name; std::getline(names, name, ',');) {
                const auto& v = checks::cache_registry().get(name);  // InputError naming it when unknown
                if (!v.is_fault) throw InputError("--faults: '" + name + "' is a production cache, not a fault");
                faults.push_back(&v);
              }
            }
            // One write per line: the runs below report from several threads.
            auto say = [](const std::string& s) { std::cerr << ("verify: " + s + "\n"); };
            checks::Fixture fx = o->fixture.load(dev, /*need_dir=*/false);
            say("model " + (o->fixture.shipped() ? fx.dir + "/fixture.safetensors" : o->fixture.checkpoint) + ", weights digest " +
                checks::model_digest(fx.model));
            const bool goldens = !fx.dir.empty() && std::ifstream(fx.dir + "/sample_grid.json").good();
            std::vector<checks::VerifyRow> rows;
            const auto production = checks::cache_registry().all(/*faults=*/false);

            // Batch 1: every production cache (the negative controls) at the seed's 600 tokens, and every
            // fault through every check at context + 64 tokens (past the window, half the cost).
            Timer t;
            checks::EquivalenceOptions opts{at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong).unsqueeze(0).to(dev), o->tokens};
            say("reference: uncached greedy run, full-forward and banded logits");
            const auto ref = checks::build_reference(fx.model, opts);
            checks::InjectionOptions io;
            io.controls = production;
            io.reference = &ref;
            io.fault_tokens = std::min(o->tokens, fx.model->config().context + 64);
            const auto rep = checks::run_injection(fx.model, opts, faults, io, say);
            for (const auto& c : rep.controls) rows.push_back(equivalence_row(c, ""));
            {
              std::string fig = std::to_string(rep.caught()) + "/" + std::to_string(rep.faults.size()) + " faults caught";
              double seconds = 0;
              for (const auto& f : rep.faults) {
                for (const auto& c : f.checks) seconds += c.seconds;
                if (!f.missed_expected().empty()) fig += "; " + f.fault + " MISSED by " + f.missed_expected().front();
                if (f.fault == "rope-offset" || f.fault == "topleft-mask")
                  fig += "; " + f.fault + " drifts after " + (f.drift_after ? std::to_string(*f.drift_after) : std::string("never/100"));
              }
              if (!faults.empty()) rows.push_back({"fault-matrix", rep.faults_passed(), fig, seconds});
            }
            // A batch of three different prompts through every check (the batch check inside every run
            // above compares rows with their prompts alone too, past the window).
            const at::Tensor batch = at::tensor(std::vector<int64_t>{1, 2, 3, 17, 250, 9, 400, 33, 1024}, at::kLong)
                                         .view({3, 3}).remainder(fx.model->config().vocab_size).to(dev);
            checks::EquivalenceOptions bopts{batch, std::min<int64_t>(o->tokens, 96)};
            say("a batch of 3 prompts: reference");
            const auto bref = checks::build_reference(fx.model, bopts);
            if (goldens) say("goldens in " + fx.dir);
            else say("no golden files for this model: golden checks skipped (record them with `tinygpt golden update`)");
            // Per production cache: the batch of three, then its goldens; run side by side as the
            // fault matrix's runs are (each its own cache and generators), rows kept in this order.
            const bool reuse = o->tokens == 600;  // the golden greedy run is the same uncached run
            std::vector<std::vector<checks::VerifyRow>> parts(2 * production.size());
            checks::run_in_parallel(parts.size(), checks::default_workers(dev), [&](size_t i) {
              const checks::CacheVariant* v = production[i / 2];
              if (i % 2 == 0) {
                parts[i].push_back(equivalence_row(checks::check_equivalence(fx.model, bopts, bref, *v), ", batch 3"));
                say("a batch of 3 prompts: " + v->name + " checked");
                return;
              }
              if (!goldens) return;
              Timer pt;  // the golden rows share their run's time (the batch row carries its checks' own)
              const auto gs = checks::verify_goldens(fx, dev, v->name == "rolling" ? nullptr : v, reuse ? &ref : nullptr);
              const double each = pt.seconds() / static_cast<double>(std::max<size_t>(1, gs.size()));
              for (const auto& g : gs) parts[i].push_back({"golden:" + g.name, g.passed, g.detail, each});
              say("goldens through " + v->name + " checked");
            });
            for (size_t k : {0, 1})  // every batch row first, then every golden row
              for (size_t i = k; i < parts.size(); i += 2) rows.insert(rows.end(), parts[i].begin(), parts[i].end());
            say("sampler self-check");
            t = Timer();
            const auto sc = checks::sampler_selfcheck(checks::production_pick(), dev);
            for (const auto& s : sc) rows.push_back({"sampler:" + s.name, s.passed, s.detail, t.seconds() / sc.size()});
            std::cout << checks::format_verify_table(rows);
            std::cout << "\nfault matrix:\n" << checks::format_injection(rep);
            for (const auto& c : rep.controls)
              if (!c.passed()) std::cout << "\n" << c.cache << ":\n" << checks::format_equivalence(c);
            nlohmann::json doc = checks::to_json(rows);
            doc["fault_matrix"] = checks::to_json(rep);
            checks::write_json_atomically(o->json, doc);
            if (!o->junit.empty()) checks::write_junit(o->junit, rows);
            if (o->report.any()) {
              checks::ReportInput in;
              in.command = "verify";
              in.subject = "model " + (o->fixture.shipped() ? fx.dir + "/fixture.safetensors" : o->fixture.checkpoint) +
                           " (weights digest " + checks::model_digest(fx.model) + "), " + std::to_string(o->tokens) +
                           " greedy tokens from ids [1, 2, 3]";
              in.rows = rows;
              in.injection = &rep;
              in.bench = bench;
              in.provenance = report_provenance(dev);
              in.context = fx.model->config().context;
              write_reports(o->report, in);
            }
            bool ok = true;
            for (const auto& r : rows) ok &= r.passed;
            return ok ? int(kOk) : int(kCheckFailed);
          }};
}

}  // namespace tinygpt::cli
