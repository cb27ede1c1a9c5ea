// `tinygpt conform`: an inference engine in any language, started as a child process and driven
// over protocol version 1 (engine_process.h; the README's "Verify an engine in any language"),
// checked against our reference model as `tinygpt equivalence` checks a cache, and its sampler
// against every law that holds for a sampler seen through its draws.
#include <ATen/ATen.h>
#include <rapidcheck.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "engine_process.h"
#include "report.h"
#include "report_files.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/checks/equivalence.h"
#include "tinygpt/laws/sampler_laws.h"
#include "tinygpt/safetensors.h"

namespace tinygpt::cli {

namespace {

using nlohmann::json;

// A wrong answer to a valid request: fails the check that sent it.
struct WrongAnswer : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

json ids_json(const at::Tensor& ids) {  // (B, T) int64 -> [[...], ...]
  at::Tensor c = ids.to(at::kCPU).contiguous();
  json rows = json::array();
  for (int64_t b = 0; b < c.size(0); ++b) {
    const int64_t* p = c[b].data_ptr<int64_t>();
    rows.push_back(std::vector<int64_t>(p, p + c.size(1)));
  }
  return rows;
}

// The engine, as the checks see it: requests with their answers judged.
class Engine {
 public:
  Engine(EngineProcess& p, int64_t vocab) : p_(p), vocab_(vocab) {}

  json ok(const json& req) {
    json a = p_.call(req);
    if (!a["ok"].get<bool>())
      throw WrongAnswer("'" + req["op"].get<std::string>() + "' answered ok false: " + a["error"].get<std::string>());
    return a;
  }
  void reset() { ok({{"op", "reset"}}); }
  // (B, T) ids -> (B, V) float logits of the last position.
  at::Tensor prefill(const at::Tensor& ids) { return logits(ok({{"op", "prefill"}, {"ids", ids_json(ids)}}), ids.size(0), "prefill"); }
  at::Tensor step(const at::Tensor& ids) { return logits(ok({{"op", "step"}, {"ids", ids_json(ids)}}), ids.size(0), "step"); }

  // Greedy from `prompt` (B, T0), fed back by the suite: reset, prefill, then n - 1 steps.
  // seq (B, T0 + n), logits (B, n, V): the logits each new token was chosen from.
  struct Run {
    at::Tensor seq, logits;
  };
  Run greedy(const at::Tensor& prompt, int64_t n) {
    reset();
    std::vector<at::Tensor> steps{prefill(prompt)};
    std::vector<at::Tensor> seq{prompt};
    for (int64_t i = 0; i < n; ++i) {
      at::Tensor next = steps.back().argmax(-1, true);  // (B, 1)
      seq.push_back(next);
      if (i + 1 < n) steps.push_back(step(next));
    }
    return {at::cat(seq, 1), at::stack(steps, 1)};
  }

 private:
  at::Tensor logits(const json& a, int64_t rows, const std::string& op) {
    if (!a.contains("logits") || !a["logits"].is_array() || static_cast<int64_t>(a["logits"].size()) != rows)
      throw WrongAnswer("'" + op + "' answered without \"logits\" as " + std::to_string(rows) + " rows");
    at::Tensor out = at::empty({rows, vocab_}, at::kFloat);
    float* o = out.data_ptr<float>();
    for (int64_t b = 0; b < rows; ++b) {
      const json& r = a["logits"][b];
      if (!r.is_array() || static_cast<int64_t>(r.size()) != vocab_)
        throw WrongAnswer("'" + op + "' answered row " + std::to_string(b) + " with " +
                          (r.is_array() ? std::to_string(r.size()) : std::string("no")) + " logits, expected " +
                          std::to_string(vocab_));
      for (int64_t v = 0; v < vocab_; ++v) {
        const json& x = r[v];
        if (!x.is_number() || !std::isfinite(x.get<double>()))
          throw WrongAnswer("'" + op + "' answered a logit that is not a finite number at row " + std::to_string(b) +
                            ", id " + std::to_string(v) + ": " + x.dump());
        o[b * vocab_ + v] = x.get<float>();
      }
    }
    return out;
  }

  EngineProcess& p_;
  int64_t vocab_;
};

// The engine's sampler as a SamplerUnderTest: `pick` through `sample` requests, seeded from
// LibTorch's default generator (so the laws' manual_seed makes draws repeatable). Rows that repeat
// (x.repeat({N, 1})) go once each with n = N: the protocol's draws are independent by contract.
struct RemoteSampler {
  EngineProcess& p;
  std::optional<std::string> unusable;  // set once the engine cannot be talked to
  int64_t requests = 0;

  at::Tensor pick(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) {
    if (unusable) throw std::runtime_error(*unusable);
    at::Tensor x = logits.to(at::kCPU).to(at::kFloat).contiguous();
    at::Tensor h = history.defined() ? history.to(at::kCPU).to(at::kLong).contiguous() : at::Tensor();
    const int64_t B = x.size(0), V = x.size(1), T = h.defined() ? h.size(1) : 0;
    // Distinct rows and each row's occurrence number.
    std::map<std::pair<std::vector<float>, std::vector<int64_t>>, int64_t> index;
    std::vector<int64_t> which(B), occurrence(B);
    std::vector<int64_t> count;
    std::vector<int64_t> first_row;
    for (int64_t b = 0; b < B; ++b) {
      const float* xp = x[b].data_ptr<float>();
      std::vector<int64_t> hv;
      if (T) hv.assign(h[b].data_ptr<int64_t>(), h[b].data_ptr<int64_t>() + T);
      auto [it, fresh] = index.try_emplace({std::vector<float>(xp, xp + V), std::move(hv)}, static_cast<int64_t>(count.size()));
      if (fresh) count.push_back(0), first_row.push_back(b);
      which[b] = it->second;
      occurrence[b] = count[it->second]++;
    }
    int64_t n = count[0];
    for (int64_t c : count)
      if (c != n) n = -1;
    std::vector<int64_t> send = first_row;
    if (n < 0) {  // unequal repeats: every row once
      n = 1;
      send.resize(B);
      for (int64_t b = 0; b < B; ++b) send[b] = b, which[b] = b, occurrence[b] = 0;
    }
    json rows = json::array(), hist = json::array();
    for (int64_t b : send) {
      json r = json::array();
      const float* xp = x[b].data_ptr<float>();
      for (int64_t v = 0; v < V; ++v) {
        if (std::isfinite(xp[v])) r.push_back(xp[v]);
        else if (xp[v] < 0 && std::isinf(xp[v])) r.push_back("-inf");
        else throw std::invalid_argument("conform: a law made a logit the protocol cannot carry");
      }
      rows.push_back(std::move(r));
      hist.push_back(T ? std::vector<int64_t>(h[b].data_ptr<int64_t>(), h[b].data_ptr<int64_t>() + T) : std::vector<int64_t>{});
    }
    const int64_t seed = at::randint(0, int64_t(1) << 30, {1}, at::kLong).item<int64_t>();
    const json req{{"op", "sample"}, {"logits", rows}, {"history", hist}, {"temperature", s.temperature},
                   {"top_k", s.top_k}, {"top_p", s.top_p}, {"penalty", s.penalty}, {"seed", seed}, {"n", n}};
    json a;
    try {
      a = p.call(req);
    } catch (const EngineUnusable& e) {
      unusable = e.what();
      throw;
    }
    ++requests;
    if (!a["ok"].get<bool>()) throw WrongAnswer("'sample' answered ok false: " + a["error"].get<std::string>());
    const json& ids = a.contains("ids") ? a["ids"] : json();
    if (!ids.is_array() || ids.size() != send.size())
      throw WrongAnswer("'sample' answered without \"ids\" as " + std::to_string(send.size()) + " rows");
    at::Tensor out = at::empty({B}, at::kLong);
    for (int64_t b = 0; b < B; ++b) {
      const json& r = ids[which[b]];
      if (!r.is_array() || static_cast<int64_t>(r.size()) != n)
        throw WrongAnswer("'sample' answered a row without " + std::to_string(n) + " ids");
      const json& id = r[occurrence[b]];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= V)
        throw WrongAnswer("'sample' answered id " + id.dump() + ", outside [0, " + std::to_string(V) + ")");
      out[b] = id.get<int64_t>();
    }
    return out;
  }
};

// Runs one RapidCheck property as rc::check does, with its report kept: the verdict line and the
// failed assertion go in the row, the whole report to stderr on failure (RapidCheck prints the
// RC_PARAMS reproduce string for every failed property when the process exits).
bool run_property(const std::string& name, const std::function<void()>& body, std::string& figure) {
  rc::detail::configuration();
  rc::detail::TestMetadata metadata;
  metadata.id = name;
  metadata.description = name;
  const auto result = rc::detail::checkTestable(body, metadata);
  std::ostringstream report;
  rc::detail::printResultMessage(result, report);
  std::istringstream lines(report.str());
  std::string line, why, assertion;
  while (std::getline(lines, line)) {
    if (why.empty() && !line.empty()) why = line;
    if (assertion.empty() && (line.rfind("RC_ASSERT", 0) == 0 || line.find("answered") != std::string::npos ||
                              line.find("exception") != std::string::npos))
      assertion = line;
  }
  figure = why + (assertion.empty() ? "" : "; " + assertion);
  const bool ok = result.template is<rc::detail::SuccessResult>();
  if (!ok) std::cerr << "\n- " << name << "\n" << report.str() << "\n";
  return ok;
}

struct ConformOptions {
  std::string engine;
  std::string checkpoint;
  int64_t tokens = 600;
  double tolerance = checks::kLogitTolerance;
  bool no_past_window = false;
  double timeout = 30;
  std::string json, junit;
  std::vector<std::string> checks{"all"};
  ReportFiles report;
};

const std::vector<std::string> kCheckGroups = {"tokens", "logits", "past-window", "reset", "batch", "sampler"};

}  // namespace

Command add_conform(CLI::App& app) {
  auto o = std::make_shared<ConformOptions>();
  auto run_opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "conform",
      "Verify an inference engine in any language: start COMMAND through /bin/sh -c, drive it over protocol 1\n"
      "(one JSON object per line on its stdin/stdout; see the README) and check it against our reference:\n"
      "greedy tokens (the first context - 3 identical), every step's logits against the full forward and,\n"
      "past the window, the banded reference, batch rows, reset, and the sampler's laws through `sample`.\n"
      "Exits 0 when every check passes, 1 when the engine is wrong (the check is named), 2 when it cannot\n"
      "be run at all (it does not start, hello or load fails, an answer is not JSON, it dies or times out).");
  cmd->add_option("--engine", o->engine, "the engine's command line, run through /bin/sh -c")->required();
  cmd->add_option("--checkpoint", o->checkpoint, "model to check on (.pt or .safetensors; default: the shipped fixture)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tokens", o->tokens, "greedy tokens of the main run (past the window when > context - 3)")
      ->capture_default_str()->check(kPositive);
  cmd->add_option("--tolerance", o->tolerance, "largest |logit difference| allowed against the reference")
      ->capture_default_str()->check(kPositive);
  cmd->add_flag("--no-past-window", o->no_past_window,
                "never step past the context: for engines with other long-sequence semantics (the check is skipped, and said)");
  cmd->add_option("--timeout", o->timeout, "seconds to wait for each answer")->capture_default_str()->check(kPositive);
  cmd->add_option("--checks", o->checks, "run only these groups: tokens, logits, past-window, reset, batch, sampler (default all)")
      ->delimiter(',')->check(CLI::IsMember([] { auto v = kCheckGroups; v.push_back("all"); return v; }()));
  cmd->add_option("--json", o->json, "write the checks as JSON here (atomically)");
  cmd->add_option("--junit", o->junit, "write the checks as JUnit XML here (atomically)");
  o->report.add(cmd, /*bench=*/false);
  add_run_options(cmd, *run_opts);
  return {cmd, [o, run_opts] {
            apply_run_options(*run_opts);
            const std::string path = o->checkpoint.empty() ? checks::data_dir() + "/fixture.safetensors" : o->checkpoint;
            Checkpoint ck = read_any_checkpoint(path);
            GPT model(ck.config, 0);
            try {
              load_weights(model, ck.tensors);
            } catch (const std::exception& e) {
              throw std::invalid_argument(path + ": " + e.what());
            }
            model->eval();
            const Config& cfg = model->config();
            const int64_t V = cfg.vocab_size, ctx = cfg.context;
            at::NoGradGuard no_grad;

            // The weights in the formats an engine may load, in a private folder removed on exit.
            std::string tmpl = (std::filesystem::temp_directory_path() / "tinygpt-conform-XXXXXX").string();
            if (!mkdtemp(tmpl.data())) throw std::runtime_error("conform: cannot create a temporary folder");
            struct Remove {
              std::string dir;
              ~Remove() { std::error_code ec; std::filesystem::remove_all(dir, ec); }
            } remove{tmpl};

            EngineProcess proc(o->engine, o->timeout);
            std::string name, format;
            try {
              json hello = proc.call({{"op", "hello"}, {"protocol", 1}});
              if (!hello["ok"].get<bool>()) throw EngineUnusable("engine: 'hello' answered ok false: " + hello["error"].get<std::string>());
              name = hello.value("name", std::string("(unnamed)"));
              if (hello.contains("formats") && hello["formats"].is_array())
                for (const auto& f : hello["formats"])
                  if (f.is_string() && (f == "pt" || f == "safetensors") && format.empty()) format = f.get<std::string>();
              if (format.empty()) throw EngineUnusable("engine: 'hello' named no format we write (\"pt\" or \"safetensors\"): " + hello.dump());
              const std::string file = tmpl + (format == "pt" ? "/model.pt" : "/model.safetensors");
              if (format == "pt") write_torch_checkpoint(file, ck);
              else write_safetensors_checkpoint(file, ck);
              json load = proc.call({{"op", "load"}, {"checkpoint", file}, {"format", format}});
              if (!load["ok"].get<bool>()) throw EngineUnusable("engine: 'load' answered ok false: " + load["error"].get<std::string>());
            } catch (const EngineUnusable& e) {
              std::cerr << "tinygpt: error: " << e.what() << "\n";
              return int(kBadInput);
            }
            std::cerr << "conform: engine '" << name << "' loaded " << path << " as " << format << "\n";

            Engine engine(proc, V);
            std::vector<checks::VerifyRow> rows;
            std::optional<std::string> fatal;
            auto selected = [&](const std::string& group) {
              for (const auto& c : o->checks)
                if (c == "all" || c == group) return true;
              return false;
            };
            auto row = [&](const std::string& check, const std::function<void(checks::VerifyRow&)>& body) {
              const std::string group = check.substr(0, check.find('/'));
              // The main run feeds logits and past-window too: it runs when any of the three is asked for.
              if (!selected(group) && !(group == "tokens" && (selected("logits") || selected("past-window")))) return;
              checks::VerifyRow r{check, true, "", 0};
              const auto t0 = std::chrono::steady_clock::now();
              if (fatal) {
                r.passed = false, r.figure = "not run: the engine could not be run";
              } else {
                std::cerr << "conform: " << check << " ..." << std::endl;
                try {
                  body(r);
                } catch (const EngineUnusable& e) {
                  fatal = e.what();
                  r.passed = false, r.figure = e.what();
                } catch (const std::exception& e) {
                  std::string msg = e.what();
                  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
                  r.passed = false, r.figure = msg;
                }
              }
              r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              if (!r.passed && !fatal) std::cerr << "conform: FAIL " << check << ": " << r.figure << "\n";
              rows.push_back(std::move(r));
            };

            // The reference: the uncached greedy run from [1, 2, 3] and its step references.
            const at::Tensor prompt = at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong).unsqueeze(0);
            const int64_t T0 = prompt.size(1), inside_steps = ctx - T0 + 1;
            const int64_t n = o->no_past_window ? std::min(o->tokens, inside_steps) : o->tokens;
            checks::EquivalenceOptions eo{prompt, n};
            const checks::Reference ref = checks::build_reference(model, eo);
            const double tol = o->tolerance;
            const int64_t must_match = std::max<int64_t>(0, std::min(ctx - T0, n));

            Engine::Run main;
            checks::StepReference own;
            row("tokens", [&](checks::VerifyRow& r) {
              main = engine.greedy(prompt, n);
              at::Tensor same = (main.seq == ref.uncached).all(0).narrow(0, T0, n);
              at::Tensor diff = same.logical_not().nonzero();
              const int64_t prefix = diff.numel() ? diff[0][0].item<int64_t>() : n;
              r.passed = prefix >= must_match;
              r.figure = "first " + std::to_string(std::min(prefix, must_match)) + " of " + std::to_string(must_match) +
                         " in-window tokens identical";
              if (!r.passed)
                r.figure += "; the engine's token at position " + std::to_string(T0 + prefix) +
                            " differs (reference top-2 margin there " + fmt(ref.uncached_margin[prefix].item<double>()) + ")";
              own = main.seq.equal(ref.uncached) ? ref.steps : checks::reference_for(model, main.seq, T0, n);
            });
            auto need_main = [&] {
              if (!main.logits.defined()) throw std::runtime_error("the main run did not complete (see tokens)");
            };
            row("logits", [&](checks::VerifyRow& r) {
              need_main();
              const auto d = checks::compare_steps(main.logits, own.full, T0 - 1, tol);
              r.passed = !d.first_position_over;
              r.figure = "vs full forward, inside the window: " + checks::describe_steps(d, tol, own.full);
            });
            if (o->no_past_window && selected("past-window")) {
              rows.push_back({"past-window", true, "skipped (--no-past-window): the engine never stepped past the context", 0});
            } else {
              row("past-window", [&](checks::VerifyRow& r) {
                need_main();
                const auto d = checks::compare_steps(main.logits, own.band, T0 - 1, tol);
                r.passed = !d.first_position_over;
                r.figure = "vs banded reference, every step: " + checks::describe_steps(d, tol, own.band);
                if (n <= inside_steps) r.figure += " (never past the window: --tokens " + std::to_string(o->tokens) + ")";
              });
            }
            row("reset", [&](checks::VerifyRow& r) {
              need_main();
              const int64_t k = std::min<int64_t>(32, n);
              engine.greedy((prompt + 7).remainder(V), k);
              const Engine::Run again = engine.greedy(prompt, k);
              const at::Tensor first = main.logits.narrow(1, 0, k);
              const auto d = checks::compare_steps(again.logits, first, T0 - 1, tol);
              r.passed = !d.first_position_over;
              r.figure = "after reset and another sequence: " + checks::describe_steps(d, tol, first);
            });
            row("batch", [&](checks::VerifyRow& r) {
              const int64_t rows_n = 3;
              const int64_t nb = o->no_past_window ? std::min<int64_t>(n, inside_steps) : std::min(n, ctx + 32);
              const at::Tensor prompts = (prompt + at::arange(rows_n, at::kLong).unsqueeze(1) * 11).remainder(V);  // (3, T0)
              const Engine::Run b = engine.greedy(prompts, nb);
              r.figure = std::to_string(rows_n) + " different prompts, " + std::to_string(nb) + " steps";
              for (int64_t i = 0; i < rows_n; ++i) {  // each row against its own sequence alone
                const auto alone = checks::reference_for(model, b.seq.narrow(0, i, 1), T0, nb);
                const at::Tensor& want = o->no_past_window ? alone.full : alone.band;
                const auto d = checks::compare_steps(b.logits.narrow(0, i, 1), want, T0 - 1, tol);
                if (d.first_position_over) {
                  r.passed = false;
                  r.figure = "row " + std::to_string(i) + " vs that prompt alone: " + checks::describe_steps(d, tol, want);
                  return;
                }
              }
              r.figure += ", every row equal to its prompt alone within " + fmt(tol);
            });

            // The sampler: every law that holds for a sampler seen through its draws.
            RemoteSampler remote{proc, std::nullopt, 0};
            props::SamplerUnderTest sut{"engine", "the engine's sampler through 'sample'", nullptr,
                                        [&](const at::Tensor& l, const at::Tensor& h, const SamplingSettings& s) {
                                          return remote.pick(l, h, s);
                                        }};
            const c10::Device cpu(c10::kCPU);
            for (const auto& law : props::generated_laws()) {
              if (!law.pick_only) continue;
              row("sampler/" + law.name, [&](checks::VerifyRow& r) {
                r.passed = run_property(law.name, [&] { law.body(sut, cpu); }, r.figure);
                if (remote.unusable) throw EngineUnusable(*remote.unusable);
              });
            }
            for (const auto& check : props::fixed_checks()) {
              row("sampler/" + check.name, [&](checks::VerifyRow& r) {
                const std::string why = check.run(sut, cpu);
                r.passed = why.empty();
                r.figure = why.empty() ? check.formula : why;
              });
            }

            const bool quit_clean = !fatal && proc.quit();
            if (!fatal && !quit_clean) rows.push_back({"quit", false, "the engine did not exit 0 after 'quit'", 0});
            std::cout << "conform: engine '" << name << "' (" << o->engine << "), " << proc.requests() << " requests\n"
                      << checks::format_verify_table(rows, "conform");
            bool passed = true;
            for (const auto& r : rows) passed = passed && r.passed;
            if (!o->json.empty())
              checks::write_json_atomically(o->json, {{"engine", name}, {"command", o->engine}, {"protocol", 1},
                                                      {"checkpoint", path}, {"passed", passed && !fatal},
                                                      {"tolerance", tol}, {"past_window", !o->no_past_window},
                                                      {"rows", checks::to_json(rows)}});
            if (!o->junit.empty()) checks::write_junit(o->junit, rows);
            if (o->report.any()) {
              checks::ReportInput in;
              in.command = "conform";
              in.subject = "engine '" + name + "' (" + o->engine + ") on " + path;
              in.rows = rows;
              in.provenance = report_provenance(c10::Device(c10::kCPU));
              in.context = ctx;
              in.tolerance = tol;
              write_reports(o->report, in);
            }
            if (fatal) {
              std::cerr << "tinygpt: error: " << *fatal << "\n";
              return int(kBadInput);
            }
            return passed ? int(kOk) : int(kCheckFailed);
          }};
}

}  // namespace tinygpt::cli
