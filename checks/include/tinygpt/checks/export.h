// Our model in the formats engines load: the series' .pt, .safetensors, GGUF for llama.cpp (written
// in C++, tinygpt/gguf.h) and ONNX for ONNX Runtime (through engines/onnxruntime/export_onnx.py and
// python3-torch, the one export that needs Python: LibTorch has no ONNX exporter). `tinygpt export`
// and `tinygpt conform` (for an engine whose hello names one of these formats) both call it.
#pragma once

#include <string>
#include <vector>

#include "tinygpt/checkpoint.h"
#include "tinygpt/gpt.h"

namespace tinygpt::checks {

// pt, safetensors, gguf, onnx, hf (a Hugging Face directory of a zoo member: hf_checkpoint.h).
const std::vector<std::string>& export_formats();

// Writes `model` (read from `ck`) to `out` in `format`, atomically. std::invalid_argument for an unknown
// format; std::runtime_error with one clear line when ONNX export cannot run (no python3-torch).
// `tokenizer` (hf only): the tokenizer.json the directory gets, in the tokenizers library's format
// (Tokenizer::to_hf_json); empty: the shipped fixture's where the model's vocabulary is its size, else none.
void export_model(const Checkpoint& ck, GPT& model, const std::string& format, const std::string& out,
                  const std::string& tokenizer = "");

}  // namespace tinygpt::checks
