// `tinygpt equivalence` and `tinygpt inject`: the cache checks from the command line.
#include <ATen/ATen.h>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "tinygpt/tools/cross_device.h"
#include "model_source.h"
#include "report_files.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/catalogue.h"
#include "tinygpt/checks/faults.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/checks/diagnose.h"
#include "tinygpt/checks/inject.h"
#include "tinygpt/checks/report.h"
#include "tinygpt/checks/target.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::cli {

namespace {
using results::join;

struct CheckOptions {
  RunOptions run;
  ModelSource model;
  std::string ids = "1,2,3", prompt, tokenizer;
  int64_t tokens = 600;
  int64_t batch = 1;
  std::string cache = checks::kSeriesCache;
  std::string json;
  ReportFiles report;
};

void add_check_options(CLI::App* cmd, CheckOptions& o) {
  cmd->add_option("--ids", o.ids, "prompt as comma-separated token ids")->capture_default_str();
  cmd->add_option("--prompt", o.prompt, "prompt text instead of --ids (needs a tokenizer)");
  cmd->add_option("--tokenizer", o.tokenizer, cli::kTokenizerHelp)->check(CLI::ExistingPath);
  cmd->add_option("--tokens", o.tokens, "greedy tokens to generate")->capture_default_str()->check(kPositive);
  cmd->add_option("--batch", o.batch, "rows (row b uses the prompt shifted by b ids, so rows differ)")
      ->capture_default_str()->check(kPositive);
  cmd->add_option("--json", o.json, "write the JSON report here (atomically)");
  o.report.add(cmd, /*bench=*/false);
  add_model_options(cmd, o.model);
  add_run_options(cmd, o.run);
}

// The prompt ids from --ids, or from --prompt through --tokenizer (loaded only for --prompt).
std::vector<int64_t> prompt_ids(const CheckOptions& o, int64_t vocab) {
  std::unique_ptr<Tokenizer> tok;
  const std::string path = cli::tokenizer_for(o.tokenizer, o.model.checkpoint);
  if (!o.prompt.empty() && !path.empty()) tok = std::make_unique<Tokenizer>(Tokenizer::load(path));
  return cli::prompt_ids(o.ids, o.prompt, tok.get(), vocab);
}

// Row b is the prompt with every id shifted by b (mod V), so a batch holds different prompts.
at::Tensor batch_prompt(const std::vector<int64_t>& ids, int64_t batch, int64_t vocab, c10::Device dev) {
  return checks::shifted_rows(at::tensor(ids, at::kLong).unsqueeze(0), batch, vocab).to(dev);  // (batch, T0)
}
}  // namespace

Command add_equivalence(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "equivalence",
      "Prove a cache changes nothing: the production loop's greedy tokens against the uncached loop (inside\n"
      "the window), its own logits against the full forward (inside) and the banded window reference (every\n"
      "step, past the window too), a second sequence on the same cache (reset), the harness's teacher-forced\n"
      "loop, a seeded sampled run, a prompt longer than the window, and a batch of prompts, each row against its\n"
      "own sequence alone.\n"
      "Exits 1 when any check fails, naming the check and the first position.");
  add_check_options(cmd, *o);
  cmd->add_option("--cache", o->cache, "cache implementation to verify (rolling, static, a registered one, or a fault name)")
      ->capture_default_str();
  auto names = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--checks", *names,
                  "run only these rows of the check table (" + checks::model_check_list() + ", or a sampler/<law>\n"
                  "row); default: the default set (" + join(checks::model_checks_with(static_cast<checks::Tags>(checks::Tag::Default))) +
                      "). `tinygpt checks` lists them")
      ->delimiter(',');
  auto variation = std::make_shared<uint64_t>(0);
  cmd->add_option("--vary", *variation,
                  "held-out runs: N > 0 runs the serving rows with another churn plan (seed 36 + N), other prompt lengths and\n"
                  "another context-shift keep, so positions and magnitudes move while the operations stay; --diagnose reruns its\n"
                  "faults the same way (0: the documented runs)")
      ->capture_default_str();
  auto diagnose = std::make_shared<bool>(false);
  cmd->add_flag("--diagnose", *diagnose,
                "when rows fail, run the fault catalogue through the same rows and say which fault's signature they show\n"
                "(the operation each failure followed, where it started, how it grew), or what they show when none does");
  return {cmd, [o, names, variation, diagnose] {
            const c10::Device dev = apply_run_options(o->run);
            const auto& variant = checks::cache_registry().get(o->cache);
            GPT model = load_model(o->model, dev);
            checks::EquivalenceOptions opts;
            opts.prompt = batch_prompt(prompt_ids(*o, model->config().vocab_size), o->batch, model->config().vocab_size, dev);
            opts.tokens = o->tokens;
            opts.variation = *variation;
            std::cerr << "equivalence: cache " << variant.name << ", " << opts.tokens << " tokens, batch " << o->batch
                      << " on " << dev << "\n";
            for (const auto& n : *names) checks::find_check(n);  // an unknown name is bad input, before the run
            const auto ref = checks::build_reference(model, opts);
            checks::ModelTarget target(model, variant);
            // A low-precision cache is judged by its KL budget (the variant's kv_budget).
            const auto r = checks::run_checks(model, checks::judged_as(opts, variant), target, *names, &ref);
            std::cout << checks::format_equivalence(r);
            nlohmann::json doc = checks::to_json(r);
            if (*diagnose && !r.passed()) {
              const auto d = checks::diagnose(model, checks::judged_as(opts, variant), r.checks,
                                              [](const std::string& s) { std::cerr << "equivalence: " << s << "\n"; });
              if (d.ran()) {
                std::cout << "diagnosis: " << d.text << "\n";
                doc["diagnosis"] = checks::to_json(d);
              }
            }
            if (!o->json.empty()) results::write_json_atomically(o->json, with_provenance(doc, dev));
            if (o->report.any()) {
              tools::ReportInput in;
              in.command = "equivalence";
              in.subject = "cache " + variant.name + ", " + std::to_string(opts.tokens) + " tokens, batch " + std::to_string(o->batch);
              in.rows = r.checks;
              in.single = &r;
              in.provenance = report_provenance(dev);
              in.context = model->config().context;
              write_reports(o->report, in);
            }
            return r.passed() ? int(kOk) : int(kCheckFailed);
          }};
}

Command add_inject(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  auto fault = std::make_shared<std::string>("all");
  auto io = std::make_shared<checks::InjectionOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inject",
      "Run fault-injected decode paths (attention, cache, loop and batch bugs) through every check and print\n"
      "the detection matrix (fault x check), each fault's drift from the correct cached output, and the\n"
      "mutation score. Exits 1 if any fault is missed by every check or by a check that must catch it\n"
      "(MISSED*), or if a production cache (the negative controls) fails a check. The runs go side by side\n"
      "on the CPU, one per --threads, each on one thread.");
  cmd->add_option("--fault", *fault, "fault name, or all")->capture_default_str();
  cmd->add_option("--drift-tokens", io->drift_tokens, "greedy tokens for the drift measure")->capture_default_str()->check(kPositive);
  cmd->add_option("--fault-tokens", io->fault_tokens,
                  "new tokens of each fault's run (0: --tokens; context + 64 reaches every past-window fault)")
      ->capture_default_str()->check(kNonNegative);
  add_check_options(cmd, *o);
  return {cmd, [o, fault, io] {
            const c10::Device dev = apply_run_options(o->run);
            std::vector<const checks::CacheVariant*> faults;
            const checks::CacheVariant* named = nullptr;
            if (*fault != "all") {
              named = &checks::cache_registry().get(*fault);
              if (!named->is_fault) throw std::invalid_argument("--fault: '" + *fault + "' is not a fault");
            }
            GPT model = load_model(o->model, dev);
            const Config& cfg = model->config();
            // The seed's faults on the seed's architecture; on a zoo member, the zoo's faults its features call for.
            if (named) {
              if (const std::string why = checks::fault_refusal(*named, cfg); !why.empty())
                throw std::invalid_argument("--fault " + named->name + " " + why);
              faults.push_back(named);
            } else {
              faults = checks::faults_for(cfg, checks::FaultUse::Inject).faults;
            }
            checks::EquivalenceOptions opts;
            opts.prompt = batch_prompt(prompt_ids(*o, model->config().vocab_size), o->batch, model->config().vocab_size, dev);
            opts.tokens = o->tokens;
            const auto rep = checks::run_injection(model, opts, faults, *io,
                                                   [](const std::string& s) { std::cerr << "inject: " << s << "\n"; });
            for (const auto& c : rep.controls)
              if (!c.passed()) std::cout << "negative control " << c.cache << ":\n" << checks::format_equivalence(c);
            std::cout << checks::format_injection(rep);
            for (const auto& f : rep.faults) std::cout << "  " << f.fault << ": " << f.description << "\n";
            if (!o->json.empty()) results::write_json_atomically(o->json, with_provenance(checks::to_json(rep), dev));
            if (o->report.any()) {
              tools::ReportInput in;
              in.command = "inject";
              in.subject = std::to_string(rep.faults.size()) + (rep.faults.size() == 1 ? " fault, " : " faults, ") + std::to_string(opts.tokens) + " tokens";
              for (const auto& c : rep.controls) {
                checks::CheckResult row;
                row.name = "negative control " + c.cache;
                row.status = checks::worst(c.checks);
                row.detail = c.passed() ? "every check passes" : "a check fails";
                in.rows.push_back(row);
              }
              for (const auto& f : rep.faults) {
                checks::CheckResult row;
                row.name = "fault " + f.fault;
                for (const auto& c : f.checks) row.seconds += c.seconds;
                const auto missed = f.missed_expected();
                row.status = !f.observable ? checks::Status::Skipped
                             : f.caught() && missed.empty() ? checks::Status::Pass : checks::Status::Fail;
                row.detail = !f.observable ? f.inert_text()
                             : !f.caught() ? "missed by every check"
                             : !missed.empty() ? "MISSED by " + missed.front()
                                               : "caught; " + (f.drift_after ? "drifts after " + std::to_string(*f.drift_after) + " tokens"
                                                                             : std::string("no token drift in ") + std::to_string(f.drift_window));
                in.rows.push_back(row);
              }
              in.injection = &rep;
              in.provenance = report_provenance(dev);
              in.context = model->config().context;
              write_reports(o->report, in);
            }
            return rep.passed() ? int(kOk) : int(kCheckFailed);
          }};
}

Command add_checks(CLI::App& app) {
  auto markdown = std::make_shared<bool>(false), json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "checks",
      "List the check table: every model check (what a pass proves, what a failure points to, how it is judged,\n"
      "its tags and cost), every fault and the checks that must catch it, the deviations an engine may declare and\n"
      "the rows each touches, and the sampler rows. --markdown prints docs/checks.md's generated tables.");
  cmd->add_flag("--markdown", *markdown, "the tables as Markdown (what docs/checks.md holds between its generated markers)");
  cmd->add_flag("--json", *json, "everything as one JSON object, with the commands of this tinygpt");
  return {cmd, [markdown, json, &app] {
            if (*json) {
              nlohmann::json doc = checks::catalogue_json();
              nlohmann::json commands = nlohmann::json::array();
              for (const CLI::App* sub : app.get_subcommands({})) commands.push_back(sub->get_name());
              doc["commands"] = commands;
              std::cout << doc.dump(2) << "\n";
            } else if (*markdown) {
              std::cout << checks::catalogue_markdown();
            } else {
              std::cout << checks::catalogue_text();
            }
            return int(kOk);
          }};
}

Command add_cross_device(CLI::App& app) {
  struct Opts {
    RunOptions run;
    ModelSource model;
    std::string ids = "1,2,3", cache = checks::kSeriesCache, json;
    int64_t tokens = 256;
  };
  auto o = std::make_shared<Opts>();
  o->run.device = "cuda";
  CLI::App* cmd = app.add_subcommand(
      "cross-device",
      "CPU against --device (default cuda) on one checkpoint (default: the shipped fixture) and prompt:\n"
      "the full forward's logits and each device's cached greedy loop, compared by normalised mean squared\n"
      "error (at most 1e-6), and greedy tokens identical up to the first near-tie. Exits 1 otherwise.");
  cmd->add_option("--ids", o->ids, "prompt as comma-separated token ids")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "greedy tokens")->capture_default_str()->check(kPositive);
  cmd->add_option("--cache", o->cache, "cache implementation on both devices")->capture_default_str();
  cmd->add_option("--json", o->json, "write the per-position NMSE and the verdict here (atomically)");
  add_model_options(cmd, o->model);
  add_run_options(cmd, o->run);
  return {cmd, [o] {
            const c10::Device dev = apply_run_options(o->run);
            if (o->model.checkpoint.empty()) o->model.checkpoint = checks::data_dir() + "/fixture.safetensors";
            const auto& variant = checks::cache_registry().get(o->cache);
            GPT cpu = load_model(o->model, c10::Device(c10::kCPU));
            GPT other = load_model(o->model, dev);
            const at::Tensor prompt = ids_tensor(parse_ids(o->ids, cpu->config().vocab_size, "--ids"), 1, c10::Device(c10::kCPU));
            const auto r = tools::cross_device(cpu, other, prompt, o->tokens, variant, variant);
            std::cout << tools::format_cross_device(r);
            if (!o->json.empty())
              results::write_json_atomically(o->json, {{"device", r.device}, {"cache", r.cache}, {"passed", r.passed()},
                                                      {"tolerance", tools::kNmseTolerance}, {"worst_forward_nmse", r.worst_forward},
                                                      {"worst_loop_nmse", r.worst_loop}, {"forward_nmse", r.forward_nmse},
                                                      {"loop_nmse", r.loop_nmse}, {"near_tie", r.near_tie},
                                                      {"first_difference", r.first_difference ? nlohmann::json(*r.first_difference) : nlohmann::json()}});
            return r.passed() ? int(kOk) : int(kCheckFailed);
          }};
}

}  // namespace tinygpt::cli
