// Where a command's model comes from: a checkpoint (.pt as the series writes it, or
// .safetensors), or untrained weights from a seed (the series' init).
#pragma once

#include <CLI/CLI.hpp>
#include <c10/core/Device.h>
#include <cstdint>
#include <string>

#include "tinygpt/gpt.h"

namespace tinygpt::cli {

struct ModelSource {
  std::string checkpoint;  // empty = untrained
  uint64_t weight_seed = 0;
};

// Adds --checkpoint and --weight-seed.
void add_model_options(CLI::App* cmd, ModelSource& src);
// Builds the model on `device` in eval mode; conversions (f16 -> f32) are said on stderr.
GPT load_model(const ModelSource& src, c10::Device device);

}  // namespace tinygpt::cli
