#include "tinygpt/tools/spec_bench.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "tinygpt/device.h"
#include "tinygpt/fused_step.h"
#include "tinygpt/generate.h"
#include "tinygpt/serving.h"
#include "tinygpt/speculative.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt::tools {

namespace {

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Row b's prompt: the same opening the goldens decode from, moved by b ids (different rows, different texts).
std::vector<std::vector<int64_t>> prompts_for(int64_t batch, int64_t vocab) {
  std::vector<std::vector<int64_t>> p;
  for (int64_t b = 0; b < batch; ++b) p.push_back({(1 + 37 * b) % vocab, (2 + 37 * b) % vocab, (3 + 37 * b) % vocab});
  return p;
}

at::Tensor as_batch(const std::vector<std::vector<int64_t>>& prompts, c10::Device dev) {
  std::vector<int64_t> flat;
  for (const auto& p : prompts) flat.insert(flat.end(), p.begin(), p.end());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(prompts.size()), -1}).to(dev);
}

}  // namespace

SpecBenchReport run_spec_bench(GPT& target, GPT draft, const SpecBenchOptions& o,
                               const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  if (o.tokens < 1) throw std::invalid_argument("bench --speculative: --tokens must be >= 1");
  for (const auto& d : o.drafts)
    if (d != "model" && d != "ngram" && d != "self")
      throw std::invalid_argument("bench --speculative: unknown draft '" + d + "' (model, ngram, self)");
  for (int64_t k : o.widths)
    if (k < 1 || k > 64) throw std::invalid_argument("bench --speculative: k must be in [1, 64]");
  const Config& cfg = target->config();
  cfg.require_seed_architecture("bench --speculative (its production baseline is the static cache's fused step)");
  if (draft && draft->config().vocab_size != cfg.vocab_size)
    throw std::invalid_argument("bench --speculative: the draft's vocabulary is not the target's");
  const c10::Device dev = target->emb->weight.device();
  at::NoGradGuard no_grad;
  SpecBenchReport rep;
  rep.machine = MachineInfo::current(dev);
  rep.target = "d_model " + std::to_string(cfg.d_model) + ", " + std::to_string(cfg.n_layers) + " layers, " +
               std::to_string(target->parameter_count()) + " parameters";
  rep.draft = draft ? "d_model " + std::to_string(draft->config().d_model) + ", " + std::to_string(draft->config().n_layers) +
                          " layers, " + std::to_string(draft->parameter_count()) + " parameters"
                    : "none (no trained draft: its cells are left out)";
  const int before = at::get_num_threads();
  std::vector<int> threads = o.thread_counts;
  if (threads.empty()) threads.push_back(before);
  SpeculativeSettings at_zero;
  at_zero.sampling.temperature = 0;
  for (int t : threads) {
    set_threads(t);
    for (int64_t B : o.batches) {
      const auto prompts = prompts_for(B, cfg.vocab_size);
      const at::Tensor batch = as_batch(prompts, dev);
      // The plain baselines, and the ids every speculative cell must reproduce.
      RollingKVCache rolling(cfg);
      StaticKVCache fixed(cfg);
      FusedCpuStep fused(fixed);
      DecodePath production;
      production.kernels = Kernels::Decode;
      production.step = &fused;
      generate_cached(target, batch, 16, tinygpt::greedy(), rolling);  // warm-up
      generate_cached(target, batch, 16, tinygpt::greedy(), fixed, production);
      at::Tensor plain_seq;
      const double plain_s = seconds_of([&] { plain_seq = generate_cached(target, batch, o.tokens, tinygpt::greedy(), rolling); });
      const double production_s = seconds_of([&] { generate_cached(target, batch, o.tokens, tinygpt::greedy(), fixed, production); });
      for (const auto& d : o.drafts) {
        if (d == "model" && !draft) continue;
        for (int64_t k : o.widths) {
          say(d + " draft, batch " + std::to_string(B) + ", k " + std::to_string(k) + ", " + std::to_string(t) + " threads");
          // The production path's cache and kernels: the static cache, the decode kernels (a verify step's
          // k + 1 rows through the products' kernel); a model draft computes with them too.
          auto make_drafter = [&]() -> std::unique_ptr<Drafter> {
            if (d == "ngram") return std::make_unique<NgramDrafter>();
            GPT m = d == "model" ? draft : target;
            return std::make_unique<ModelDrafter>(m, false, m->config().is_seed_architecture() ? Kernels::Decode : Kernels::Library);
          };
          SpeculativeSettings s = at_zero;
          s.k = k;
          auto make_cache = [&] { return std::unique_ptr<KVCache>(std::make_unique<StaticKVCache>(cfg)); };
          DecodePath kernels;
          kernels.kernels = Kernels::Decode;
          // Each row alone in a decoder of its own (row b seeded s.seed + b, as in a batch), one after another.
          auto alone = [&](int64_t n) {
            std::vector<SpeculativeRun> out;
            for (int64_t b = 0; b < B; ++b) {
              SpeculativeDecoder one(target, make_cache(), production_rules(), Kernels::Decode);
              const auto drafter = make_drafter();
              SpeculativeSettings row = s;
              row.seed = s.seed + static_cast<uint64_t>(b);
              out.push_back(one.run(prompts[static_cast<size_t>(b)], n, *drafter, row));
            }
            return out;
          };
          // One sequence through the single-sequence decoder; rows in one batch, one batched verify step a round.
          auto speculate = [&](int64_t n) {
            if (B == 1) return alone(n);
            RowBatch rows(*target, make_cache, kernels);
            return speculate_rows(rows, make_drafter, prompts, n, s);
          };
          speculate(16);  // warm-up
          std::vector<SpeculativeRun> runs, alone_runs;
          const double spec_s = seconds_of([&] { runs = speculate(o.tokens); });
          const double alone_s = B > 1 ? seconds_of([&] { alone_runs = alone(o.tokens); }) : 0.0;
          SpecBenchRow r;
          r.draft = d, r.batch = B, r.k = k, r.threads = t;
          const double n = static_cast<double>(B * o.tokens);
          r.plain_tok_s = n / plain_s;
          r.production_tok_s = n / production_s;
          r.spec_tok_s = n / spec_s;
          if (B > 1) r.alone_tok_s = n / alone_s;
          int64_t drafted = 0, accepted = 0, ids = 0, rounds = 0;
          r.lossless = true;
          for (int64_t b = 0; b < B; ++b) {
            const SpeculativeRun& run = runs[static_cast<size_t>(b)];
            drafted += run.drafted, accepted += run.accepted, ids += static_cast<int64_t>(run.ids.size()), rounds += run.rounds;
            const at::Tensor want = plain_seq[b].narrow(0, 3, o.tokens).to(at::kCPU);
            r.lossless = r.lossless && at::tensor(run.ids, at::kLong).equal(want);
            if (B > 1) r.lossless = r.lossless && alone_runs[static_cast<size_t>(b)].ids == run.ids;
          }
          r.acceptance = drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0;
          r.mean_accepted_length = rounds ? static_cast<double>(ids) / static_cast<double>(rounds) : 0;
          rep.rows.push_back(r);
        }
      }
    }
  }
  set_threads(before);
  return rep;
}

nlohmann::json SpecBenchReport::to_json() const {
  nlohmann::json rows_j = nlohmann::json::array();
  for (const auto& r : rows)
    rows_j.push_back({{"draft", r.draft}, {"batch", r.batch}, {"k", r.k}, {"threads", r.threads}, {"plain_tok_s", r.plain_tok_s},
                      {"production_tok_s", r.production_tok_s}, {"speculative_tok_s", r.spec_tok_s}, {"rows_alone_tok_s", r.alone_tok_s}, {"speedup", r.speedup()},
                      {"acceptance", r.acceptance}, {"mean_accepted_length", r.mean_accepted_length}, {"lossless", r.lossless}});
  return {{"machine", machine.to_json()}, {"target", target}, {"draft", draft}, {"speculative", rows_j}};
}

std::string SpecBenchReport::format() const {
  std::ostringstream s;
  s << "target: " << target << "\ndraft: " << draft << "\n";
  s << "draft  batch  k  threads  plain tok/s  production tok/s  speculative tok/s  rows alone tok/s  speedup  accepted  ids/round  lossless\n";
  for (const auto& r : rows) {
    char b[240];
    const std::string alone = r.alone_tok_s > 0 ? std::to_string(static_cast<long long>(r.alone_tok_s + 0.5)) : "-";
    std::snprintf(b, sizeof b, "%-6s %5lld %2lld %8d %12.0f %17.0f %18.0f %17s %7.2fx %8.0f%% %10.2f  %s\n", r.draft.c_str(),
                  static_cast<long long>(r.batch), static_cast<long long>(r.k), r.threads, r.plain_tok_s, r.production_tok_s,
                  r.spec_tok_s, alone.c_str(), r.speedup(), 100 * r.acceptance, r.mean_accepted_length, r.lossless ? "yes" : "NO");
    s << b;
  }
  s << "speedup: speculative against the production path (static cache, decode kernels, fused step); plain: the series'\n"
       "path (the rolling cache and the model's own step). The speculative decoder runs on the static cache with the decode\n"
       "kernels; a batch's rows speculate in one RowBatch (one batched verify step a round); rows alone: the same rows\n"
       "one after another, each in a decoder of its own. ids/round: accepted drafts and the id the target adds, per round.\n"
       "lossless: every row's ids are plain greedy's (and, at batch > 1, the rows alone give the same ids).\n";
  return s.str();
}

namespace {

// One greedy 'speculate' request from the bench's prompt: the answer's ids, the engine's own seconds and counts.
struct EngineRun {
  std::vector<int64_t> ids;
  double seconds = 0;
  int64_t rounds = 0, drafted = 0, accepted = 0;
};

EngineRun engine_speculate(checks::LoadedEngine& engine, const std::vector<int64_t>& prompt, const std::string& draft, int64_t k, int64_t n,
                           const std::string& draft_file) {
  nlohmann::json q = {{"op", "speculate"}, {"ids", prompt}, {"n", n},           {"draft", draft},  {"k", k},
                      {"rule", "exact"},   {"temperature", 0}, {"top_k", 0},       {"top_p", 1.0},     {"penalty", 1.0},
                      {"seed", 0},         {"stop", nlohmann::json::array()},      {"then", 0}};
  if (draft == "model") q["draft_model"] = draft_file;
  const nlohmann::json a = engine.call(q);
  auto bad = [&](const std::string& what) { return std::runtime_error("'speculate' answered " + what); };
  if (!a.value("ok", false)) throw bad("ok false: " + a.value("error", std::string("(no error)")).substr(0, 200));
  if (!a.contains("ids") || !a["ids"].is_array()) throw bad("no ids");
  if (!a.contains("decode_s") || !a["decode_s"].is_number() || a["decode_s"].get<double>() <= 0)
    throw checks::EngineUnusable("bench --speculative --vs-engine: 'speculate' answered without \"decode_s\", the seconds it took "
                                 "(the bench times the engine by its own clock)");
  EngineRun r;
  for (const auto& id : a["ids"]) r.ids.push_back(id.get<int64_t>());
  r.seconds = a["decode_s"].get<double>();
  r.rounds = a.value("rounds", int64_t{0}), r.drafted = a.value("drafted", int64_t{0}), r.accepted = a.value("accepted", int64_t{0});
  return r;
}

}  // namespace

SpecEngineReport run_spec_vs_engine(checks::LoadedEngine& engine, const std::string& command, const std::string& draft_file,
                                    const SpecBenchOptions& o, const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  if (o.tokens < 1 || o.tokens + 3 > engine.model()->config().context)
    throw std::invalid_argument("bench --speculative --vs-engine: --tokens from 1 to the window less the 3-id prompt (" +
                                std::to_string(engine.model()->config().context - 3) + ")");
  const nlohmann::json& hello = engine.hello();
  if (!engine.supports("speculate") || !hello.contains("speculate"))
    throw checks::EngineUnusable("engine '" + engine.name() + "' decodes no sequence speculatively: its hello lists no 'speculate' operation "
                                 "(protocol 3, docs/protocol.md)");
  std::vector<std::string> offered;
  for (const auto& d : hello["speculate"].value("drafts", nlohmann::json::array())) offered.push_back(d.get<std::string>());
  auto offers = [&](const std::string& d) { return std::find(offered.begin(), offered.end(), d) != offered.end(); };
  if (!offers("none")) throw checks::EngineUnusable("engine '" + engine.name() + "' offers no plain decoding through 'speculate' (draft \"none\")");
  SpecEngineReport rep;
  rep.engine = engine.name(), rep.command = command, rep.tokens = o.tokens;
  // The prompt our own bench decodes from; each timed run after a warm-up of 16 ids.
  const std::vector<int64_t> prompt = prompts_for(1, engine.model()->config().vocab_size).front();
  auto timed = [&](const std::string& d, int64_t k) {
    engine_speculate(engine, prompt, d, k, 16, draft_file);
    return engine_speculate(engine, prompt, d, k, o.tokens, draft_file);
  };
  say("plain decoding (draft none)");
  EngineRun plain;
  try {
    plain = timed("none", 1);
  } catch (const checks::EngineUnusable&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw checks::EngineUnusable("bench --speculative --vs-engine: plain decoding (draft none): " + std::string(e.what()));
  }
  for (const auto& d : o.drafts) {
    if (!offers(d)) {
      rep.left_out.push_back(d + ": the engine does not offer it");
      continue;
    }
    if (d == "model" && draft_file.empty()) {
      rep.left_out.push_back("model: no trained draft");
      continue;
    }
    for (int64_t k : o.widths) {
      say(d + " draft, k " + std::to_string(k));
      EngineRun run;
      try {
        run = timed(d, k);
      } catch (const checks::EngineUnusable&) {
        throw;
      } catch (const std::runtime_error& e) {  // the cell fails; the others still run
        rep.left_out.push_back(d + " at k = " + std::to_string(k) + ": " + e.what());
        continue;
      }
      SpecEngineRow r;
      r.draft = d, r.k = k;
      r.plain_tok_s = static_cast<double>(o.tokens) / plain.seconds;
      r.spec_tok_s = static_cast<double>(o.tokens) / run.seconds;
      r.acceptance = run.drafted ? static_cast<double>(run.accepted) / static_cast<double>(run.drafted) : 0;
      r.mean_accepted_length = run.rounds ? static_cast<double>(run.ids.size()) / static_cast<double>(run.rounds) : 0;
      r.lossless = run.ids == plain.ids;  // a run that emitted more ids than asked for is not
      rep.rows.push_back(r);
    }
  }
  return rep;
}

nlohmann::json SpecEngineReport::to_json() const {
  nlohmann::json rows_j = nlohmann::json::array();
  for (const auto& r : rows)
    rows_j.push_back({{"draft", r.draft}, {"k", r.k}, {"plain_tok_s", r.plain_tok_s}, {"speculative_tok_s", r.spec_tok_s},
                      {"speedup", r.speedup()}, {"acceptance", r.acceptance}, {"mean_accepted_length", r.mean_accepted_length},
                      {"lossless", r.lossless}});
  return {{"engine", engine}, {"command", command}, {"tokens", tokens}, {"left_out", left_out}, {"speculative", rows_j}};
}

std::string SpecEngineReport::format() const {
  std::ostringstream s;
  s << "engine: " << engine << " (batch 1, " << tokens << " greedy ids from a 3-id prompt, timed by the engine)\n";
  s << "draft   k  plain tok/s  speculative tok/s  speedup  accepted  ids/round  lossless\n";
  for (const auto& r : rows) {
    char b[200], len[16] = "-";  // ids per round: "-" where the engine does not count its rounds
    if (r.mean_accepted_length > 0) std::snprintf(len, sizeof len, "%.2f", r.mean_accepted_length);
    std::snprintf(b, sizeof b, "%-6s %2lld %12.0f %18.0f %7.2fx %8.0f%% %10s  %s\n", r.draft.c_str(), static_cast<long long>(r.k),
                  r.plain_tok_s, r.spec_tok_s, r.speedup(), 100 * r.acceptance, len, r.lossless ? "yes" : "NO");
    s << b;
  }
  for (const auto& l : left_out) s << "not timed: " << l << "\n";
  s << "plain: the engine's own decoding with no drafts (speculate, draft none); lossless: the ids equal that run's.\n";
  return s.str();
}

}  // namespace tinygpt::tools
