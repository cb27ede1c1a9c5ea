#include "model_source.h"

#include "tinygpt/checkpoint.h"
#include "tinygpt/kernel_step.h"

#include <iostream>


namespace tinygpt::cli {

void add_model_options(CLI::App* cmd, ModelSource& src) {
  cmd->add_option("--checkpoint", src.checkpoint, "model checkpoint: the series' .pt, a .safetensors, or a Hugging Face directory (config.json + model.safetensors)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--weight-seed", src.weight_seed, "seed of the untrained weights (without --checkpoint)")
      ->capture_default_str();
}

GPT load_model(const ModelSource& src, c10::Device device) {
  if (src.checkpoint.empty()) {
    GPT model(Config{}, src.weight_seed);
    model->to(device);
    if (device.is_cpu()) pack_parameters(*model);  // as a loaded checkpoint is (kernel_step.h)
    model->eval();
    return model;
  }
  std::vector<std::string> notes;
  GPT model = load_checkpoint(src.checkpoint, device, &notes);
  if (!notes.empty()) std::cerr << "tinygpt: note: " << notes.size() << " tensors converted (" << notes.front() << ", ...)\n";
  return model;
}

}  // namespace tinygpt::cli
