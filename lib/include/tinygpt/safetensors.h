// safetensors read and write (https://github.com/huggingface/safetensors format): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {str: str}}, then the bytes. Reading validates the header length, offsets (in bounds, no
// overlap, no holes) and that dtype x shape matches each byte range.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tinygpt/checkpoint.h"

namespace tinygpt {

struct TensorFile {
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // in offset order
  std::map<std::string, std::string> metadata;
};

// Throws std::runtime_error naming the file and the problem.
TensorFile read_safetensors(const std::string& path);
// Writes atomically (temporary file renamed into place). Tensors are written contiguous, CPU.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata);

// A model checkpoint in safetensors: the config (and step) in __metadata__["config"] as JSON;
// the tied head.weight is not stored twice (metadata "tied": "head.weight=emb.weight").
Checkpoint read_safetensors_checkpoint(const std::string& path);
void write_safetensors_checkpoint(const std::string& path, const Checkpoint& ck,
                                  std::map<std::string, std::string> extra_metadata = {});

}  // namespace tinygpt
