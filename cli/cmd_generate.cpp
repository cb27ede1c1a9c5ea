// `tinygpt generate`: cached or uncached generation. With --tokenizer and --prompt it prints text,
// otherwise one line of new ids per batch row.
#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "cli_common.h"
#include "commands.h"
#include "model_source.h"
#include "tinygpt/errors.h"
#include "tinygpt/generate.h"
#include "tinygpt/hf_checkpoint.h"
#include "tinygpt/sampler.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::cli {

namespace {
struct GenerateOptions {
  RunOptions run;
  ModelSource model;
  std::string ids = "1,2,3", prompt, tokenizer;
  int64_t tokens = 32;
  int64_t batch = 1;
  bool uncached = false;
  std::string cache;  // "": static for the seed's architecture, rolling for a model with SPEC 10's knobs
  std::string stop;   // "": the checkpoint directory's eos ids; "none"; or ids
  SamplingSettings sampling{0.0, 0, 1.0, 1.0};  // greedy unless told otherwise
  uint64_t seed = 1;
};
}  // namespace

void add_sampling_options(CLI::App* cmd, SamplingSettings& s, uint64_t& seed) {
  cmd->add_option("--temperature", s.temperature, "0 = greedy (argmax)")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "keep the k highest scores (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "nucleus mass in (0, 1] (1 = off)")->capture_default_str();
  cmd->add_option("--penalty", s.penalty, "repetition penalty > 0 (1 = off)")->capture_default_str();
  cmd->add_option("--seed", seed, "sampling seed (draws equal torch.manual_seed(seed) + the seed's pick)")->capture_default_str();
}

Command add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate tokens, cached (default) or uncached, greedy unless sampling options are given");
  cmd->add_option("--ids", o->ids, "prompt as comma-separated token ids")->capture_default_str();
  cmd->add_option("--prompt", o->prompt, "prompt text (needs a tokenizer); prints text");
  cmd->add_option("--tokenizer", o->tokenizer, kTokenizerHelp)->check(CLI::ExistingPath);
  cmd->add_option("--tokens", o->tokens, "new tokens to generate")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--batch", o->batch, "rows, each with the same prompt")->capture_default_str()->check(kPositive);
  cmd->add_option("--stop", o->stop,
                  "ids that end a row, comma-separated (the id is printed), or none (default: a Hugging Face directory's\n"
                  "eos_token_id from generation_config.json, else config.json; otherwise none)");
  cmd->add_flag("--uncached", o->uncached, "use the uncached reference loop instead of the KV cache");
  cmd->add_option("--cache", o->cache,
                  "cache implementation: static (fastest; the default), rolling (the series'; the default for a model\n"
                  "with SPEC 10's architecture knobs, which the static cache refuses), or a fault name to see its effect");
  add_sampling_options(cmd, o->sampling, o->seed);
  add_model_options(cmd, o->model);
  add_run_options(cmd, o->run);
  return {cmd, [o] {
            const c10::Device dev = apply_run_options(o->run);
            o->sampling.validate();
            if (!o->cache.empty()) checks::cache_registry().get(o->cache);  // an unknown name fails before the model loads
            std::unique_ptr<Tokenizer> tok;
            if (const std::string path = tokenizer_for(o->tokenizer, o->model.checkpoint); !path.empty())
              tok = std::make_unique<Tokenizer>(Tokenizer::load(path));
            GPT model = load_model(o->model, dev);
            const auto& variant = checks::cache_registry().get(
                !o->cache.empty() ? o->cache : model->config().is_seed_architecture() ? "static" : std::string(checks::kSeriesCache));
            const auto ids = prompt_ids(o->ids, o->prompt, tok.get(), model->config().vocab_size);
            at::Tensor prompt = ids_tensor(ids, o->batch, dev);
            const int64_t ctx = model->config().context;
            if (static_cast<int64_t>(ids.size()) > ctx)
              std::cerr << "generate: note: the prompt has " << ids.size() << " ids, more than the context of " << ctx
                        << ": the model sees its last " << ctx << " (SPEC 4); the output keeps the whole prompt\n";
            std::vector<int64_t> stop;
            if (o->stop.empty()) {
              if (is_hf_directory(o->model.checkpoint)) stop = read_hf_stop_ids(o->model.checkpoint);
              for (int64_t id : stop)
                if (id >= model->config().vocab_size)
                  throw InputError(o->model.checkpoint + ": eos_token_id " + std::to_string(id) + " is past the model's vocabulary of " +
                                   std::to_string(model->config().vocab_size));
              if (!stop.empty())
                std::cerr << "generate: a row ends at eos id " << join_ids(stop) << " (the directory's; --stop none runs every token)\n";
            } else if (o->stop != "none") {
              stop = parse_ids(o->stop, model->config().vocab_size, "--stop");
            }
            const TokenChooser choose = sampler(o->sampling, make_generator(dev, o->seed));
            at::Tensor out;
            if (o->uncached) {
              out = generate_uncached(model, prompt, o->tokens, choose);
            } else {
              checks::Decoder d = variant.decoder(model->config());
              GPT runs = variant.model(model);
              out = generate_cached(runs, prompt, o->tokens, choose, *d.cache, d.path, {}, stop);
            }
            const int64_t T0 = prompt.size(1);
            for (int64_t b = 0; b < out.size(0); ++b) {
              const at::Tensor r = out[b].to(at::kCPU).contiguous();  // (T0 + m,)
              std::vector<int64_t> row(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
              for (size_t i = T0; i < row.size(); ++i)  // the row ends at its first stop id
                if (std::find(stop.begin(), stop.end(), row[i]) != stop.end()) {
                  row.resize(i + 1);
                  break;
                }
              if (tok && !o->prompt.empty()) std::cout << tok->decode(row) << "\n";
              else std::cout << join_ids(std::vector<int64_t>(row.begin() + T0, row.end())) << "\n";
            }
            return int(kOk);
          }};
}

}  // namespace tinygpt::cli
