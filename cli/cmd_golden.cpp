// `tinygpt sample-grid`, `tinygpt golden verify|update` and `tinygpt verify`, the main job.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include <filesystem>

#include "cli_common.h"
#include "report_files.h"
#include "commands.h"
#include "model_source.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/sample_grid.h"
#include "tinygpt/atomic_file.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/checks/report.h"
#include "tinygpt/checks/verify.h"
#include "tinygpt/errors.h"
#include "tinygpt/zoo.h"

namespace tinygpt::cli {

namespace {

// The golden folder and model a command works on: the shipped fixture unless --checkpoint names
// another model (its tokenizer from --tokenizer or <dir>/tokenizer.json; its goldens in --dir).
struct FixtureOptions {
  std::string dir, checkpoint, tokenizer, model;
  void add(CLI::App* cmd, const char* dir_help) {
    cmd->add_option("--dir", dir, dir_help);
    auto* ck = cmd->add_option("--checkpoint", checkpoint,
                               "another model (.pt, .safetensors, or a Hugging Face directory: config.json + model.safetensors)\n"
                               "instead of the shipped fixture")
                   ->check(CLI::ExistingPath);
    cmd->add_option("--model", model, kModelHelp)->excludes(ck);
    cmd->add_option("--tokenizer", tokenizer,
                    "its tokenizer.json, the series' or a Hugging Face one (default: <dir>/tokenizer.json, else the --checkpoint\n"
                    "directory's own)")
        ->check(CLI::ExistingPath);
  }
  bool shipped() const { return checkpoint.empty() && model.empty(); }
  // Throws std::invalid_argument when a custom model has no tokenizer to use.
  checks::Fixture load(c10::Device dev, bool need_dir) const {
    if (!model.empty()) {  // a zoo member: its folder holds the checkpoint and goldens; the fixture's tokenizer
      const std::string member = zoo_member_dir(model), d = dir.empty() ? member : dir;
      return checks::load_fixture(member + "/model.safetensors", tokenizer.empty() ? checks::data_dir() + "/tokenizer.json" : tokenizer,
                                  d, dev);
    }
    if (shipped()) return checks::load_fixture(dir.empty() ? checks::data_dir() : dir, dev);
    if (need_dir && dir.empty()) throw std::invalid_argument("--checkpoint needs --dir: the folder of that model's golden files");
    std::string tok = !tokenizer.empty() ? tokenizer : dir.empty() ? "" : dir + "/tokenizer.json";
    if (tokenizer.empty() && (tok.empty() || !std::ifstream(tok))) tok = tokenizer_for("", checkpoint);  // a Hugging Face directory's own
    if (tok.empty() || !std::ifstream(tok))
      throw std::invalid_argument("--checkpoint needs --tokenizer (or a tokenizer.json in --dir or in the --checkpoint directory)");
    return checks::load_fixture(checkpoint, tok, dir, dev);
  }
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
              results::write_json_atomically(o->json, {{"prompt", o->prompt}, {"seed", o->seed}, {"tokens", o->tokens}, {"rows", rows}});
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
  auto cases = std::make_shared<std::vector<std::string>>();
  verify->add_option("--case", *cases, "only these cases, comma-separated: sample-grid (seconds), greedy-600 (the uncached\n"
                                        "600-token run: most of the time), sampler-selfcheck; default: every one")
      ->delimiter(',');
  return {cmd, [fo, run, verify, cases] {
            const char* ci = std::getenv("CI");
            if (!verify->parsed() && ci && std::string(ci) == "true")
              throw std::invalid_argument("golden update refused: CI=true (goldens change only by a deliberate local run)");
            const c10::Device dev = apply_run_options(*run);
            if (!verify->parsed() && !fo->dir.empty()) std::filesystem::create_directories(fo->dir);  // goldens for a new model
            checks::Fixture fx = fo->load(dev, /*need_dir=*/true);
            if (!verify->parsed()) {
              for (const auto& l : checks::update_goldens(fx, dev)) std::cout << l << "\n";
              return int(kOk);
            }
            bool ok = true;
            for (const auto& r : checks::verify_goldens(fx, dev, nullptr, nullptr, *cases)) {
              std::cout << (r.ok() ? "PASS " : "FAIL ") << r.name << ": " << r.detail << "\n";
              ok &= r.ok();
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
    std::vector<std::string> checks;
    bool require_batch_invariance = false;
    bool require_thread_invariance = false;
    bool full_matrix = false;
    bool deep = false;
    bool zoo = false;
    std::optional<double> tolerance;
    bool quick = false;
    ReportFiles report;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "The main job, no arguments needed: on the shipped fixture, every production cache (and any registered\n"
      "one) through every equivalence check at batch 1 and at a batch of three prompts, the fault matrix, the\n"
      "goldens through every production cache, and the sampler self-check. With --checkpoint, the same on\n"
      "your model (goldens when --dir holds golden files recorded for it: `tinygpt golden update --dir D\n"
      "--checkpoint F --tokenizer T`); with --model zoo:NAME on a zoo member, its goldens beside it (the caches\n"
      "and faults stated for the seed's architecture only are left out, each with the reason). Prints one summary table, writes a JSON report (and JUnit XML with\n"
      "--junit), exits 1 on any failure. Independent runs (the fault matrix's, the batch of three, the\n"
      "goldens per cache) go side by side on the CPU, one per --threads, each on one thread.");
  o->fixture.add(cmd, "golden folder (default: the shipped fixture's)");
  cmd->add_option("--json", o->json, "JSON report path")->capture_default_str();
  cmd->add_option("--junit", o->junit, "also write JUnit XML here");
  cmd->add_option("--tokens", o->tokens, "greedy tokens for the cache checks")->capture_default_str()->check(kPositive);
  cmd->add_option("--faults", o->faults,
                  "faults for the fault matrix: all, none, or names, comma-separated (`tinygpt inject --help` lists them)")
      ->capture_default_str();
  cmd->add_option("--checks", o->checks,
                  "run only these rows of the check table, comma-separated (default: every row but self; `tinygpt checks`\n"
                  "lists them); each fault runs the selected rows among its own, and a fault none of whose catching\n"
                  "rows is selected is left out of the matrix")
      ->delimiter(',');
  cmd->add_option("--tolerance", o->tolerance,
                  "the logit rows' max |diff| bound (default 1e-4, a few times fp32's noise on the seed's model; a model\n"
                  "whose logits reach the hundreds differs from itself at another batch shape by ~4e-4: docs/perf.md)")
      ->check(kPositive);
  cmd->add_flag("--quick", o->quick,
                "a first look at a large model: every run inside the context (the past-window rows skipped, saying so),\n"
                "--tokens 64 and --faults none unless given (a 135M-parameter model: minutes, not hours; docs/perf.md)");
  cmd->add_flag("--full-matrix", o->full_matrix,
                "run each fault through every row of its set, to see which other rows catch it too (about 3x the\n"
                "matrix's time); default: the rows that must catch it (what the verdict gates on) and tokens");
  cmd->add_flag("--deep", o->deep,
                "also the rows of statistical power: spec-distribution's chi-square draws (the speculative decoder's\n"
                "exact rule against the target's distribution; minutes on 2 cores) and the faults only they catch");
  cmd->add_flag("--require-batch-invariance", o->require_batch_invariance,
                "fail batch-sizes on any difference between a row in a batch and the row alone (default: only over the tolerance)");
  cmd->add_flag("--require-thread-invariance", o->require_thread_invariance,
                "fail thread-counts on any difference between a cache's run at 1 thread and at 2 or every core (default: "
                "only over the tolerance)");
  o->report.add(cmd, /*bench=*/true);
  cmd->add_flag("--zoo", o->zoo,
                "run verify on every zoo member trained here (golden/zoo/NAME/; docs/SPEC.md section 10) in turn: one JSON\n"
                "report each (--json's name with -NAME before .json), a summary line each with its time, exit 1 if any fails")
      ->excludes("--checkpoint")
      ->excludes("--model")
      ->excludes("--junit");
  // One verify run: the model, the report, its files. True when every check passed.
  auto run_verify_once = [](const Opts& o, checks::VerifyOptions vo, c10::Device dev, const nlohmann::json& bench) {
    checks::Fixture fx = o.fixture.load(dev, /*need_dir=*/false);
    const std::string model = o.fixture.shipped()          ? fx.dir + "/fixture.safetensors"
                              : !o.fixture.model.empty() ? o.fixture.model + " (" + fx.dir + "/model.safetensors)"
                                                          : o.fixture.checkpoint;
    vo.progress("model " + model + ", weights digest " + checks::model_digest(fx.model));
    checks::VerifyReport rep = checks::run_verify(fx, vo);
    rep.subject = "model " + model + " (weights digest " + checks::model_digest(fx.model) + "), " +
                  std::to_string(vo.tokens) + " greedy tokens from ids [1, 2, 3]";
    std::cout << checks::format_table(rep.rows, "verify");
    if (!rep.matrix.faults.empty()) std::cout << "\nfault matrix:\n" << checks::format_injection(rep.matrix);
    else
      std::cout << "\nfault matrix: no fault run"
                << (vo.inside_context && o.faults == "all" ? " (--quick: name faults with --faults)"
                    : o.fixture.shipped() || o.faults == "none" ? "" : " (see the lines above: left out)")
                << "\n";
    for (const auto& c : rep.matrix.controls)
      if (!c.passed()) std::cout << "\n" << c.cache << ":\n" << checks::format_equivalence(c);
    results::write_json_atomically(o.json, with_provenance(checks::to_json(rep), dev));
    if (!o.junit.empty()) write_text_atomically(o.junit, checks::junit_xml(rep.rows, "tinygpt.verify"));
    if (o.report.any()) {
      tools::ReportInput in;
      in.command = "verify";
      in.subject = rep.subject;
      in.rows = rep.rows;
      in.injection = &rep.matrix;
      if (!rep.kv.empty()) in.kv = &rep.kv;
      in.bench = bench;
      in.provenance = report_provenance(dev);
      in.context = fx.model->config().context;
      write_reports(o.report, in);
    }
    return rep.passed();
  };
  add_run_options(cmd, o->run);
  return {cmd, [o, run_verify_once, cmd] {
            const c10::Device dev = apply_run_options(o->run);
            if (o->zoo && o->report.any()) throw std::invalid_argument("--zoo writes JSON reports only (--html/--markdown: use --model zoo:NAME)");
            const nlohmann::json bench = read_bench_json(o->report.bench_json);  // a bad file fails before the run
            checks::VerifyOptions vo;
            vo.device = dev;
            vo.tokens = o->quick && cmd->count("--tokens") == 0 ? 64 : o->tokens;
            vo.inside_context = o->quick;
            vo.checks = o->checks;
            vo.full_matrix = o->full_matrix;
            vo.deep = o->deep;
            vo.tolerance = o->tolerance;
            vo.require_batch_invariance = o->require_batch_invariance;
            vo.require_thread_invariance = o->require_thread_invariance;
            if (o->quick && cmd->count("--faults") == 0) vo.faults.emplace();  // none
            else if (o->faults != "all") {  // named faults are checked before the run too
              vo.faults.emplace();
              if (o->faults != "none") {
                std::stringstream names(o->faults);
                for (std::string name; std::getline(names, name, ',');) {
                  const auto& v = checks::cache_registry().get(name);  // invalid_argument naming it when unknown
                  if (!v.is_fault) throw InputError("--faults: '" + name + "' is a production cache, not a fault");
                  vo.faults->push_back(&v);
                }
              }
            }
            // One write per line: the runs report from several threads.
            vo.progress = [](const std::string& s) { std::cerr << ("verify: " + s + "\n"); };
            if (o->zoo) {  // every member in turn, each as --model zoo:NAME would run it
              std::vector<std::string> lines;
              bool all_ok = true;
              for (const auto& name : zoo_names()) {
                Opts one = *o;
                one.zoo = false;
                one.fixture.model = "zoo:" + name;
                const auto dot = o->json.rfind(".json");
                one.json = (dot == std::string::npos ? o->json : o->json.substr(0, dot)) + "-" + name + ".json";
                const auto t0 = std::chrono::steady_clock::now();
                std::string verdict;
                try {
                  const bool ok = run_verify_once(one, vo, dev, bench);
                  all_ok &= ok;
                  verdict = ok ? "PASS" : "FAIL";
                } catch (const InputError& e) {  // a member not trained in this install
                  verdict = std::string("not run: ") + e.what();
                }
                const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                std::ostringstream l;
                l << "zoo:" << name << "  " << verdict << "  " << static_cast<int64_t>(sec) << " s  " << one.json;
                lines.push_back(l.str());
              }
              std::cout << "\nzoo:\n";
              for (const auto& l : lines) std::cout << "  " << l << "\n";
              return all_ok ? int(kOk) : int(kCheckFailed);
            }
            return run_verify_once(*o, vo, dev, bench) ? int(kOk) : int(kCheckFailed);
          }};
}

}  // namespace tinygpt::cli
