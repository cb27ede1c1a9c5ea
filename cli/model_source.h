// Where a command's model comes from: a checkpoint (.pt as the series writes it, .safetensors, or a
// Hugging Face directory), a zoo member by name (zoo:NAME, golden/zoo/NAME/), or untrained weights
// from a seed (the series' init).
#pragma once

#include <CLI/CLI.hpp>
#include <c10/core/Device.h>
#include <cstdint>
#include <string>

#include "tinygpt/gpt.h"

namespace tinygpt::cli {

struct ModelSource {
  std::string checkpoint;  // empty = untrained
  std::string model;       // zoo:NAME, instead of --checkpoint
  uint64_t weight_seed = 0;
};

// The folder of zoo member `spec` ("zoo:NAME"): <data dir>/zoo/NAME, holding model.safetensors and its
// goldens. std::invalid_argument for a spec that names no member; InputError when the member is not
// trained in this install (its model.safetensors missing).
std::string zoo_member_dir(const std::string& spec);
// The --model option's help, shared by every command that takes it.
extern const char* const kModelHelp;

// Adds --checkpoint, --model and --weight-seed.
void add_model_options(CLI::App* cmd, ModelSource& src);
// Builds the model on `device` in eval mode; conversions (f16 -> f32) are said on stderr.
GPT load_model(const ModelSource& src, c10::Device device);

}  // namespace tinygpt::cli
