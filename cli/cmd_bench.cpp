// `tinygpt bench`: the seed's benchmark (SPEC 7) per cache, and where a decode step's time goes.
#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <unistd.h>

#include "tinygpt/tools/bench.h"
#include "tinygpt/tools/spec_bench.h"
#include "tinygpt/checkpoint.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/data.h"
#include "cli_common.h"
#include "commands.h"
#include "model_source.h"
#include "tinygpt/checks/conform.h"
#include "tinygpt/checks/report.h"

namespace tinygpt::cli {

namespace {
// --cache left at its default (rolling,static) means "not given".
bool cmd_caches_given(const std::vector<std::string>& caches) {
  return caches != tools::BenchOptions{}.caches;
}
}  // namespace

Command add_bench(CLI::App& app) {
  struct Opts {
    RunOptions run;
    ModelSource model;
    tools::BenchOptions bench;
    std::string json;
    bool no_uncached = false, profile = false;
    int64_t profile_batch = 1;
    std::string vs_engine;
    tools::VsEngineOptions vs;
    bool speculative = false;
    tools::SpecBenchOptions spec;
    std::string draft;
    double timeout_s = 120;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "The seed's benchmark (SPEC 7): tokens per second with and without the cache for every batch x tokens\n"
      "cell and every --cache, the cache's memory at a full window against 2 x layers x tokens x KV heads x head\n"
      "size x 4 bytes (d_model for the seed; a sliding layer's tokens are its window), and peak resident memory. Untrained weights (--weight-seed 0), greedy, float32, an 8-token random\n"
      "prompt, a 16-token warm-up per path and batch. Prints the machine (CPU, threads and how idle threads\n"
      "wait, LibTorch, the BLAS actually loaded). Numbers vary between runs on shared machines: compare ratios\n"
      "from one run; --thread-sweep 1,2 times every cell at each thread count in one run.\n"
      "Each cell also gets this machine's bound, measured in the same run: every step must read the weights\n"
      "and the cached keys and values and do its FLOPs, so it takes at least max(bytes / read rate, FLOPs /\n"
      "1024^3 matmul rate); 'of bound' is the cached rate against it.\n"
      "With --profile: where one decode step's time goes (batch 1, or --profile-batch), per cache.\n"
      "With --vs-engine CMD: ours against a conform engine's own decode loop instead (the protocol's 'bench'\n"
      "request; the llama.cpp adapter and the example engine have it): the --checkpoint (default: the fixture),\n"
      "--batch, --steps decode steps after a --prompt-len prompt, --threads for both, best of --reps interleaved\n"
      "runs; prints the ratio, each side's share of the machine's bound and whether their greedy tokens agree.\n"
      "With --speculative: the same table for speculative decoding (docs/speculative.md) on a TRAINED target\n"
      "(default: the shipped fixture, its draft golden/draft.safetensors): plain cached greedy against draft-and-\n"
      "verify per --spec-draft x --batch x --k x --thread-sweep, with the acceptance rate, ids per round and whether\n"
      "the ids are plain greedy's; a batch's rows speculate in one batch, beside the same rows one after another;\n"
      "--tokens is one count here (new ids per row, default 256). Exit 1 when a cell's ids are not plain greedy's.\n"
      "With --speculative --vs-engine CMD: a conform engine's own speculative decoding (its 'speculate' requests,\n"
      "timed by the engine) at batch 1 for each --spec-draft it offers and each --k, against its own plain decoding\n"
      "(the draft none), beside our decoder's batch-1 table from the same run.");
  cmd->add_option("--batch", o->bench.batches, "batch sizes, comma-separated")->delimiter(',')->capture_default_str()
      ->check(kPositive);
  cmd->add_option("--tokens", o->bench.tokens, "new tokens per run, comma-separated")->delimiter(',')->capture_default_str()
      ->check(kPositive);
  cmd->add_option("--cache", o->bench.caches, "caches to time, comma-separated (see `tinygpt equivalence --help`)")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--prompt-len", o->bench.prompt_len, "random prompt length")->capture_default_str()->check(kPositive);
  cmd->add_option("--thread-sweep", o->bench.thread_counts,
                  "time every cell at each of these thread counts, comma-separated (e.g. 1,2): where a second thread pays")
      ->delimiter(',')->check(kPositive);
  cmd->add_flag("--no-uncached", o->no_uncached, "skip the uncached loop (its 1024-token rows take minutes at batch 16)");
  cmd->add_flag("--profile", o->profile, "also break one decode step down into its parts, per cache");
  cmd->add_option("--profile-batch", o->profile_batch, "rows of the profiled step")->capture_default_str()->check(kPositive);
  cmd->add_option("--vs-engine", o->vs_engine, "time this conform engine's decode beside ours (see above)");
  cmd->add_option("--steps", o->vs.steps, "--vs-engine: decode steps per run (prompt + steps within the window)")
      ->capture_default_str()->check(kPositive);
  cmd->add_option("--reps", o->vs.reps, "--vs-engine: interleaved runs per side and batch; each side's best counts")
      ->capture_default_str()->check(kPositive);
  cmd->add_option("--timeout", o->timeout_s, "--vs-engine: seconds to wait for each engine answer")->capture_default_str()
      ->check(kPositive);
  cmd->add_flag("--speculative", o->speculative, "time speculative decoding against plain decoding instead (see above)");
  cmd->add_option("--spec-draft", o->spec.drafts, "--speculative: drafts, comma-separated: model (--draft), ngram, self")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--k", o->spec.widths, "--speculative: draft lengths, comma-separated")->delimiter(',')->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--draft", o->draft, "--speculative: the draft model's checkpoint (default: golden/draft.safetensors with the fixture)");
  cmd->add_option("--json", o->json, "write {machine, rows, memory, peak_rss_bytes[, profile]} here (atomically)");
  add_model_options(cmd, o->model);
  add_run_options(cmd, o->run);
  return {cmd, [o, cmd] {
            const c10::Device dev = apply_run_options(o->run);
            o->bench.uncached = !o->no_uncached;
            for (const auto& c : o->bench.caches) checks::cache_registry().get(c);  // unknown names fail before timing
            const bool tty = isatty(2);
            auto progress = [tty](const std::string& s) {
              if (tty) std::cerr << "\r\033[Kbench: " << s << std::flush;
              else std::cerr << "bench: " << s << "\n";
            };
            if (!o->vs_engine.empty() && o->speculative) {
              // The engine's own speculative decoding beside ours, in one sitting: our decoder at batch 1 first.
              if (dev.type() != c10::kCPU) throw std::invalid_argument("bench --vs-engine: CPU only (engines run on the CPU here)");
              tools::SpecBenchOptions so = o->spec;
              so.batches = {1};
              if (cmd->count("--tokens")) {
                if (o->bench.tokens.size() != 1) throw std::invalid_argument("bench --speculative: one --tokens count");
                so.tokens = o->bench.tokens.front();
              }
              const bool fixture = o->model.checkpoint.empty() && o->model.model.empty();
              const std::string draft_path = o->draft.empty() && fixture ? checks::data_dir() + "/draft.safetensors" : o->draft;
              tools::SpecEngineReport theirs;
              tools::SpecBenchReport ours;
              try {
                checks::LoadedEngine engine(o->vs_engine, o->model.checkpoint, o->timeout_s, progress);
                GPT draft{nullptr};
                std::string draft_file;
                if (!draft_path.empty()) {
                  const Checkpoint ck = read_any_checkpoint(draft_path);
                  draft = model_from_checkpoint(ck, dev, draft_path);
                  draft->eval();
                  draft_file = engine.write_model(ck, draft, "draft");
                }
                theirs = tools::run_spec_vs_engine(engine, o->vs_engine, draft_file, so, progress);
                ours = tools::run_spec_bench(engine.model(), draft, so, progress);
              } catch (const checks::EngineUnusable& e) {
                if (tty) std::cerr << "\r\033[K";
                std::cerr << "tinygpt: error: " << e.what() << "\n";
                return int(kBadInput);
              }
              if (tty) std::cerr << "\r\033[K";
              std::cout << "ours:\n" << ours.format() << "\n" << theirs.format();
              if (!o->json.empty())
                results::write_json_atomically(o->json, {{"ours", ours.to_json()}, {"engine", theirs.to_json()}});
              return int(kOk);
            }
            if (!o->vs_engine.empty()) {
              if (dev.type() != c10::kCPU) throw std::invalid_argument("bench --vs-engine: CPU only (engines run on the CPU here)");
              if (!o->bench.thread_counts.empty()) throw std::invalid_argument("bench --vs-engine: --threads, not --thread-sweep");
              if (o->bench.caches.size() != 1 && cmd_caches_given(o->bench.caches))
                throw std::invalid_argument("bench --vs-engine: one --cache at a time");
              o->vs.batches = o->bench.batches;
              o->vs.prompt_len = o->bench.prompt_len;
              o->vs.cache = cmd_caches_given(o->bench.caches) ? o->bench.caches.front() : "static";
              tools::VsEngineReport rep;
              try {
                checks::LoadedEngine engine(o->vs_engine, o->model.checkpoint, o->timeout_s, progress);
                rep = tools::run_vs_engine(engine, o->vs_engine, o->vs, progress);
              } catch (const checks::EngineUnusable& e) {
                if (tty) std::cerr << "\r\033[K";
                std::cerr << "tinygpt: error: " << e.what() << "\n";
                return int(kBadInput);
              }
              if (tty) std::cerr << "\r\033[K";
              std::cout << rep.format();
              if (!o->json.empty()) results::write_json_atomically(o->json, rep.to_json());
              return int(kOk);
            }
            if (o->speculative) {
              tools::SpecBenchOptions so = o->spec;
              so.batches = cmd->count("--batch") ? o->bench.batches : so.batches;
              if (cmd->count("--tokens")) {
                if (o->bench.tokens.size() != 1) throw std::invalid_argument("bench --speculative: one --tokens count");
                so.tokens = o->bench.tokens.front();
              }
              so.thread_counts = o->bench.thread_counts;
              const bool fixture = o->model.checkpoint.empty() && o->model.model.empty();
              ModelSource src = o->model;
              if (fixture) src.checkpoint = checks::data_dir() + "/fixture.safetensors";
              GPT target = load_model(src, dev);
              std::string draft_path = o->draft.empty() && fixture ? checks::data_dir() + "/draft.safetensors" : o->draft;
              GPT draft{nullptr};
              if (!draft_path.empty()) {
                draft = load_checkpoint(draft_path, dev);
                draft->eval();
              }
              const auto rep = tools::run_spec_bench(target, draft, so, progress);
              if (tty) std::cerr << "\r\033[K";
              std::cout << rep.format();
              if (!o->json.empty()) results::write_json_atomically(o->json, rep.to_json());
              const auto lossy = std::count_if(rep.rows.begin(), rep.rows.end(), [](const auto& r) { return !r.lossless; });
              if (lossy > 0) {  // speculation that changed the ids is a bug, not a timing
                std::cerr << "tinygpt: bench --speculative: " << lossy << " of " << rep.rows.size()
                          << " cells gave ids other than plain greedy's (lossless: NO)\n";
                return int(kCheckFailed);
              }
              return int(kOk);
            }
            GPT model = load_model(o->model, dev);
            auto rep = tools::run_bench(model, o->bench, progress);
            nlohmann::json doc = rep.to_json();
            std::vector<tools::StepProfile> profiles;
            if (o->profile) {
              nlohmann::json ps = nlohmann::json::array();
              for (const auto& c : o->bench.caches) {
                progress("profiling a decode step: " + c);
                profiles.push_back(tools::profile_step(model, c, model->config().context, o->profile_batch));
                ps.push_back(profiles.back().to_json());
              }
              doc["profile"] = ps;
            }
            if (tty) std::cerr << "\r\033[K";
            std::cout << rep.format();
            for (const auto& p : profiles) std::cout << p.format();
            if (!o->json.empty()) results::write_json_atomically(o->json, doc);
            return int(kOk);
          }};
}

}  // namespace tinygpt::cli
