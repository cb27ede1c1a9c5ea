#include "model_source.h"

#include "tinygpt/errors.h"

#include <iostream>

#include "tinygpt/safetensors.h"

namespace tinygpt::cli {

void add_model_options(CLI::App* cmd, ModelSource& src) {
  cmd->add_option("--checkpoint", src.checkpoint, "model checkpoint: the series' .pt or a .safetensors")
      ->check(CLI::ExistingFile);
  cmd->add_option("--weight-seed", src.weight_seed, "seed of the untrained weights (without --checkpoint)")
      ->capture_default_str();
}

GPT load_model(const ModelSource& src, c10::Device device) {
  if (src.checkpoint.empty()) {
    GPT model(Config{}, src.weight_seed);
    model->to(device);
    model->eval();
    return model;
  }
  Checkpoint ck = read_any_checkpoint(src.checkpoint);
  GPT model(ck.config, 0);
  std::vector<std::string> notes;
  try {
    load_weights(model, ck.tensors, &notes);
  } catch (const std::exception& e) {
    throw InputError(src.checkpoint + ": " + e.what());
  }
  if (!notes.empty()) std::cerr << "tinygpt: note: " << notes.size() << " tensors converted (" << notes.front() << ", ...)\n";
  model->to(device);
  model->eval();
  return model;
}

}  // namespace tinygpt::cli
