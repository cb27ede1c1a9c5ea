// `tinygpt conform`: parses, calls checks::run_conform, prints. The protocol is docs/protocol.md.
#include <ATen/ATen.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_common.h"
#include "model_source.h"
#include "commands.h"
#include "report_files.h"
#include "tinygpt/checks/conform.h"
#include "tinygpt/atomic_file.h"
#include "tinygpt/checks/report.h"

namespace tinygpt::cli {

namespace {

struct Opts {
  checks::ConformOptions conform;
  std::string json, junit;
  std::vector<std::string> batch_sizes;  // "1-8", "16", ...: expanded into conform.batch_sizes
  RunOptions run;
  ReportFiles report;
};

// --batch-sizes' items, each N or A-B, as the ascending sizes they name.
std::vector<int64_t> batch_sizes_from(const std::vector<std::string>& items) {
  std::vector<int64_t> sizes;
  for (const std::string& item : items) {
    int64_t a = 0, b = 0;
    char dash = 0, rest = 0;
    const int n = std::sscanf(item.c_str(), "%" SCNd64 "%c%" SCNd64 "%c", &a, &dash, &b, &rest);
    if (n == 1)
      b = a;
    else if (n != 3 || dash != '-')
      throw std::invalid_argument("--batch-sizes: '" + item + "' is not a size or a range A-B");
    if (a < 1 || b < a) throw std::invalid_argument("--batch-sizes: '" + item + "' is not a size >= 1 or a range A-B with 1 <= A <= B");
    for (int64_t s = a; s <= b; ++s) {
      if (!sizes.empty() && s <= sizes.back())
        throw std::invalid_argument("--batch-sizes: the sizes must be ascending, each once ('" + item + "' after " +
                                    std::to_string(sizes.back()) + ")");
      sizes.push_back(s);
    }
  }
  return sizes;
}

}  // namespace

Command add_conform(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "conform",
      "Verify an inference engine in any language: start COMMAND through /bin/sh -c, drive it over the conform\n"
      "protocol (one JSON object per line on its stdin/stdout; docs/protocol.md) and run it through the same checks\n"
      "as our own caches: greedy tokens (the first context - 3 identical), every step's logits against the full\n"
      "forward and, past the window, the banded reference, reset, the harness's own loop, a sampled run, a long\n"
      "prompt, batch rows, and the sampler's laws through `sample`.\n"
      "Exits 0 when every check passes, 1 when the engine is wrong (the check is named), 2 when it cannot\n"
      "be run at all (it does not start, hello or load fails, an answer is not JSON, it dies or times out).");
  auto& c = o->conform;
  cmd->add_option("--engine", c.engine, "the engine's command line, run through /bin/sh -c")->required();
  cmd->add_option("--checkpoint", c.checkpoint, "model to check on (.pt, .safetensors, or a Hugging Face directory; default: the shipped fixture)")
      ->check(CLI::ExistingPath);
  auto zoo = std::make_shared<std::string>();
  cmd->add_option("--model", *zoo,
                  "a zoo member instead: zoo:NAME (docs/SPEC.md section 10), sent in the first of the formats that carry its\n"
                  "knobs the engine's hello lists: hf (a Hugging Face directory), gguf (the llama.cpp architecture that\n"
                  "computes it), onnx (a graph of its config) or transformers-js; pt and safetensors cannot carry them")
      ->excludes("--checkpoint");
  cmd->add_option("--tokens", c.tokens, "greedy tokens of the main run (past the window when > context - 3)")
      ->capture_default_str()->check(kPositive);
  cmd->add_option("--tolerance", c.tolerance.logits, "largest |logit difference| allowed against our reference model")
      ->capture_default_str()->check(kPositive);
  cmd->add_option("--self-tolerance", c.tolerance.self,
                  "largest |logit difference| between the engine's cached steps and its own prefill (the self check)")
      ->capture_default_str()->check(kPositive);
  cmd->add_option("--self-stride", c.self_stride,
                  "the self check prefills every Nth step inside the window and the last (1: every step). Default: the "
                  "first 16 steps, every 16th, the 8 more where the run's top-2 margin is smallest, and the last")
      ->check(kPositive);
  cmd->add_option("--max-kl", c.tolerance.max_kl,
                  "judge the logit checks by mean KL(reference || engine) per step instead of --tolerance (an approximate engine)")
      ->check(kPositive);
  cmd->add_option("--min-top1", c.tolerance.min_top1, "with or instead of --max-kl: the least share of steps whose argmax agrees, in (0, 1]")
      ->check(kShare);
  cmd->add_option("--kv-type", c.kv_type,
                  "the engine's KV cache type, sent in load as \"kv_type\" (f16, q8_0, q4_0, K/V apart as q8_0/f16: what its\n"
                  "hello lists in \"kv_types\"). Adds a kv-budget row: the teacher-forced run with this cache against the same\n"
                  "engine with an f32 cache (and our model), judged by --kv-budget; the reports plot its KL per position");
  cmd->add_option("--kv-budget", c.kv_budget,
                  "the most mean KL(f32 cache || this type) per step a KV type may cost (default 3e-5: a budget is the user's\n"
                  "decision; docs/checks.md, \"Low-precision caches\", has the figures)")
      ->capture_default_str()->check(kPositive);
  cmd->add_option("--kv-min-top1", c.kv_min_top1,
                  "with --kv-budget: the least share of steps whose argmax equals the f32 cache's, in (0, 1]")
      ->check(kShare);
  cmd->add_option("--kv-compare", c.kv_compare,
                  "more KV types to cost the same way (f16,q8_0,q4_0: each a fresh engine, its own kv-budget row and plot)")
      ->delimiter(',');
  cmd->add_option("--weight-type", c.weight_type,
                  "the engine's weight type, sent in load as \"weight_type\" (q8_0, q4_0, q4_K_M: what its hello lists in\n"
                  "\"weight_types\"; the engine quantizes the float32 file it is sent). Every row is judged against our model by\n"
                  "mean KL per step at --weight-budget (plus --kv-budget with --kv-type) and against the same engine with f32\n"
                  "weights; a weight-budget row costs the teacher-forced run the way llama-perplexity reports (mean/p99/max KL, top-1)");
  cmd->add_option("--weight-budget", c.weight_budget,
                  "the most mean KL per step quantized weights may cost (default 1e-3 for q8_0, 5e-2 for q4_0 and q4_K_M: the\n"
                  "user's decision; docs/checks.md, \"Quantized weights\", has the figures)")
      ->check(kPositive);
  cmd->add_flag("--no-past-window", c.no_past_window,
                "never step past the context: for engines with other long-sequence semantics (those checks are skipped, and said)");
  cmd->add_flag("--require-batch-invariance", c.require_batch_invariance,
                "fail batch-sizes on any difference between a row in a batch and the row alone (default: only over the tolerance)");
  cmd->add_option("--batch-sizes", o->batch_sizes,
                  "the batch sizes the batch-sizes row runs, ascending, sizes and ranges (default 1-8,15-17,31-33: where kernels\n"
                  "and captured graphs change shape at 16 and 32; name the engine's own bucket edges, e.g. 1-4,8,16,24,32,64)")
      ->delimiter(',');
  cmd->add_flag("--require-thread-invariance", c.require_thread_invariance,
                "fail thread-counts on any difference between the run at 1 thread and at 2 or every core (default: only over "
                "the tolerance; the engine must offer the threads operation)");
  cmd->add_flag("--diagnose", c.diagnose,
                "when model rows fail, run the fault catalogue on our model through the same rows and say which fault\n"
                "fails them after the same operation (the entries it touched; where the check fixes the schedule, at the\n"
                "same first position) - ranked by the rows both fail, any row that differs said - and what to do, or that\n"
                "none does");
  cmd->add_option("--vary", c.variation,
                  "held-out runs: N > 0 runs the serving rows with another churn plan (seed 36 + N), other prompt lengths and\n"
                  "another context-shift keep, so positions and magnitudes move while the operations stay; --diagnose reruns its\n"
                  "faults the same way (0: the documented runs)")
      ->capture_default_str();
  cmd->add_option("--timeout", c.timeout_s, "seconds to wait for each answer")->capture_default_str()->check(kPositive);
  cmd->add_option("--checks", c.groups,
                  "run only these: model check names (" + checks::model_check_list() + ")\n"
                  "and/or sampler (every sampler row an engine's draws can show); default all. `tinygpt checks` lists them")
      ->delimiter(',');
  cmd->add_flag("--deep", c.deep,
                "also run the rows of statistical power: spec-distribution, thousands of speculative runs through the engine's\n"
                "exact rule judged by chi-square (minutes; they also run when named in --checks)");
  cmd->add_option("--spec-draws", c.spec_draws,
                  "spec-distribution's draws (0: as many as its stated power needs; fewer lower the power it reports)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  CLI::Option* repro = cmd->add_option("--repro", c.repro_dir,
                  "for each failing row, the shortest request sequence found that still fails the same way, written to\n"
                  "DIR/ROW/ as a bundle for the engine's maintainers: the model, requests.json (each request with our answer),\n"
                  "repro.py (Python's standard library and the engine's command: exit 1 while it fails, 0 once fixed) and\n"
                  "REPORT.md. DIR must be empty or new. Not with --kv-type, --weight-type, --max-kl or --min-top1");
  cmd->add_option("--repro-keep", c.repro_keep,
                  "with --repro: operations every shrunk sequence keeps on the wrong answer's row or a row it was made from\n"
                  "(shift, truncate, save, restore, fork, extend, ...), so shrinking cannot slip to another bug that fails\n"
                  "the same way")
      ->delimiter(',')->needs(repro);
  cmd->add_option("--repro-budget", c.repro_budget_s, "seconds of shrinking per failing row (it keeps the shortest sequence found)")
      ->capture_default_str()->check(kPositive)->needs(repro);
  cmd->add_option("--json", o->json, "write the checks as JSON here (atomically)");
  cmd->add_option("--junit", o->junit, "write the checks as JUnit XML here (atomically)");
  o->report.add(cmd, /*bench=*/false);
  add_run_options(cmd, o->run);
  return {cmd, [o, zoo] {
            apply_run_options(o->run);
            auto& c = o->conform;
            c.batch_sizes = batch_sizes_from(o->batch_sizes);
            if (!zoo->empty()) c.checkpoint = zoo_member_dir(*zoo) + "/model.safetensors";
            checks::conform_selection(c.groups, c.deep);  // an unknown group is bad input, before the engine starts
            c.progress = [](const std::string& s) { std::cerr << ("conform: " + s + "\n"); };
            checks::ConformReport rep;
            try {
              rep = checks::run_conform(c);
            } catch (const checks::EngineUnusable& e) {
              std::cerr << "tinygpt: error: " << e.what() << "\n";
              return int(kBadInput);
            }
            std::cout << "conform: engine '" << rep.engine_name << "' (" << rep.command << "), " << rep.requests << " requests\n";
            if (!rep.deviations.empty()) {
              std::cout << "declared deviations:";
              for (const auto& d : rep.deviations) std::cout << " " << d;
              std::cout << "\n";
            }
            std::cout << checks::format_table(rep.rows, "conform");
            if (rep.diagnosis.ran()) std::cout << "diagnosis: " << rep.diagnosis.text << "\n";
            for (const auto& r : rep.repros) {
              if (r.ok())
                std::cout << "repro: " << r.row << (r.sent_by.empty() ? "" : " (the requests of " + r.sent_by + ", whose run it judged)")
                          << (r.after.empty() ? "" : " (after the main run " + r.after + " sent)") << ": " << r.requests_before << " requests -> " << r.requests_after << " in " << r.dir
                          << " (python3 " << r.dir << "/repro.py; read " << r.dir << "/REPORT.md)\n  " << r.failure << "\n"
                          << (r.diagnosis.empty() ? std::string() : "  diagnosis from these requests: " + r.diagnosis + "\n");
              else
                std::cout << "repro: " << r.row << ": no bundle: " << r.why_not << "\n";
            }
            // llama.cpp's C API: the same requests as the calls the adapter made, a program its maintainers build.
            if (rep.engine_name.rfind("llama.cpp", 0) == 0 &&
                std::any_of(rep.repros.begin(), rep.repros.end(), [](const auto& r) { return r.ok(); }))
              std::cout << "repro: with the llama.cpp adapter, `python3 engines/llama.cpp/repro_c.py write BUNDLE` adds "
                           "repro.c: the calls that answered the requests, against llama.cpp's C API\n";
            if (!o->json.empty()) results::write_json_atomically(o->json, with_provenance(checks::to_json(rep), c10::Device(c10::kCPU)));
            if (!o->junit.empty()) write_text_atomically(o->junit, checks::junit_xml(rep.rows, "tinygpt.conform"));
            if (o->report.any()) {
              tools::ReportInput in;
              in.command = "conform";
              in.subject = "engine '" + rep.engine_name + "' (" + rep.command + ") on " + rep.checkpoint;
              in.rows = rep.rows;
              if (!rep.model.loop_band.diffs.empty()) in.single = &rep.model;
              if (!rep.kv.empty()) in.kv = &rep.kv;
              in.provenance = report_provenance(c10::Device(c10::kCPU));
              in.context = rep.model.context;
              in.tolerance = rep.model.tolerance;
              write_reports(o->report, in);
            }
            if (rep.fatal) {
              std::cerr << "tinygpt: error: " << *rep.fatal << "\n";
              return int(kBadInput);
            }
            return rep.passed() ? int(kOk) : int(kCheckFailed);
          }};
}

}  // namespace tinygpt::cli
