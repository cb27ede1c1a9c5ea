// `tinygpt generate`: cached or uncached generation, one line of new ids per batch row.
#include <ATen/ATen.h>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "model_source.h"
#include "tinygpt/generate.h"

namespace tinygpt::cli {

namespace {
struct GenerateOptions {
  RunOptions run;
  ModelSource model;
  std::string ids = "1,2,3";
  int64_t tokens = 32;
  int64_t batch = 1;
  bool uncached = false;
};
}  // namespace

Command add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Greedy-generate token ids, cached (default) or uncached, and print the new ids");
  cmd->add_option("--ids", o->ids, "prompt as comma-separated token ids")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "new tokens to generate")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", o->batch, "rows, each with the same prompt")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--uncached", o->uncached, "use the uncached reference loop instead of the KV cache");
  add_model_options(cmd, o->model);
  add_run_options(cmd, o->run);
  return {cmd, [o] {
            const c10::Device dev = apply_run_options(o->run);
            GPT model = load_model(o->model, dev);
            at::Tensor prompt = ids_tensor(parse_ids(o->ids, model->config().vocab_size, "--ids"), o->batch, dev);
            at::Tensor out;
            if (o->uncached) {
              out = generate_uncached(model, prompt, o->tokens, greedy());
            } else {
              RollingKVCache cache(model->config());
              out = generate_cached(model, prompt, o->tokens, greedy(), cache);
            }
            at::Tensor fresh = out.narrow(1, prompt.size(1), o->tokens);  // (B, tokens)
            for (int64_t b = 0; b < fresh.size(0); ++b) std::cout << join_ids(fresh[b]) << "\n";
            return int(kOk);
          }};
}

}  // namespace tinygpt::cli
