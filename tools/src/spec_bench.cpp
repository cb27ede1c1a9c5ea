#include "tinygpt/tools/spec_bench.h"

#include <ATen/ATen.h>

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

}  // namespace tinygpt::tools
