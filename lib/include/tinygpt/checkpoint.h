// A model checkpoint in memory - config, step, tensors - and what every format's reader hands on to:
// the weights' validation, the model made from them, and the one dispatch by content. Each format
// has its own header: torch_checkpoint.h (the series' .pt), safetensors.h, gguf.h (write only).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tinygpt/config.h"
#include "tinygpt/gpt.h"

namespace tinygpt {

struct Checkpoint {
  Config config;
  int64_t step = 0;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // in file order, as stored
  std::vector<std::string> notes;                           // conversions made, said once each
  std::map<std::string, std::string> metadata;              // provenance carried by safetensors files
};

// A .pt (zip) or .safetensors file, told apart by content, not by name, or a Hugging Face checkpoint
// directory (hf_checkpoint.h). InputError naming `path`.
Checkpoint read_any_checkpoint(const std::string& path);

// Validates `tensors` against the model's config and copies them in: missing or unexpected names
// (listed), shape mismatches (name, expected, got), dtypes (f16/bf16 converted and noted; others
// refused), NaN/Inf (name and count), and a head.weight that is not emb.weight. Throws
// std::runtime_error; the model is untouched on error.
void load_weights(GPT& model, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  std::vector<std::string>* notes = nullptr);

// A model of `ck`'s config holding its weights (load_weights), on `device`, in eval mode. A weight
// problem is an InputError naming `path`, the file `ck` was read from.
GPT model_from_checkpoint(const Checkpoint& ck, c10::Device device, const std::string& path,
                          std::vector<std::string>* notes = nullptr);

// The one loader for every checkpoint format: the series' .pt or a .safetensors file (told apart
// by content, read_any_checkpoint), then model_from_checkpoint.
GPT load_checkpoint(const std::string& path, c10::Device device, std::vector<std::string>* notes = nullptr);

}  // namespace tinygpt
