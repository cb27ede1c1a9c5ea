#include "model_source.h"

namespace tinygpt::cli {

void add_model_options(CLI::App* cmd, ModelSource& src) {
  cmd->add_option("--weight-seed", src.weight_seed, "seed of the untrained weights")->capture_default_str();
}

GPT load_model(const ModelSource& src, c10::Device device) {
  GPT model(Config{}, src.weight_seed);
  model->to(device);
  model->eval();
  return model;
}

}  // namespace tinygpt::cli
