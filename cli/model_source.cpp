#include "model_source.h"

#include "tinygpt/checkpoint.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/errors.h"
#include "tinygpt/kernel_step.h"
#include "tinygpt/zoo.h"

#include <filesystem>
#include <iostream>


namespace tinygpt::cli {

const char* const kModelHelp =
    "a zoo member instead: zoo:NAME (llama, mqa, mistral, gemma2, qwen3, neox; docs/SPEC.md section 10), its\n"
    "checkpoint and goldens in golden/zoo/NAME/";

std::string zoo_member_dir(const std::string& spec) {
  const std::string prefix = "zoo:";
  const std::string name = spec.rfind(prefix, 0) == 0 ? spec.substr(prefix.size()) : "";
  bool known = false;
  for (const auto& n : zoo_names()) known = known || n == name;
  if (!known) {
    std::string all;
    for (const auto& n : zoo_names()) all += (all.empty() ? "" : ", ") + prefix + n;
    throw std::invalid_argument("--model: '" + spec + "' is not a zoo member (" + all + ")");
  }
  const std::string dir = checks::data_dir() + "/zoo/" + name;
  if (!std::filesystem::exists(dir + "/model.safetensors"))
    throw InputError(dir + "/model.safetensors: zoo member " + name + " is not trained here (ci/make-zoo.sh trains it)");
  return dir;
}

void add_model_options(CLI::App* cmd, ModelSource& src) {
  auto* ck = cmd->add_option("--checkpoint", src.checkpoint,
                             "model checkpoint: the series' .pt, a .safetensors, or a Hugging Face directory (config.json + model.safetensors)")
                 ->check(CLI::ExistingPath);
  cmd->add_option("--model", src.model, kModelHelp)->excludes(ck);
  cmd->add_option("--weight-seed", src.weight_seed, "seed of the untrained weights (without --checkpoint)")
      ->capture_default_str();
}

GPT load_model(const ModelSource& src_in, c10::Device device) {
  ModelSource src = src_in;
  if (!src.model.empty()) src.checkpoint = zoo_member_dir(src.model) + "/model.safetensors";
  if (src.checkpoint.empty()) {
    GPT model(Config{}, src.weight_seed);
    model->to(device);
    if (device.is_cpu()) pack_parameters(*model);  // as a loaded checkpoint is (kernel_step.h)
    model->eval();
    return model;
  }
  std::vector<std::string> notes;
  GPT model = load_checkpoint(src.checkpoint, device, &notes);
  if (!notes.empty())
    std::cerr << "tinygpt: note: " << notes.front() << (notes.size() > 1 ? " (and " + std::to_string(notes.size() - 1) + " more)" : "")
              << "\n";
  return model;
}

}  // namespace tinygpt::cli
