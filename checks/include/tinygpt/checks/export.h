// Our model in the formats engines load: the series' .pt, .safetensors, GGUF for llama.cpp (written
// in C++, tinygpt/gguf.h) and ONNX for ONNX Runtime (through engines/onnxruntime/export_onnx.py and
// python3-torch, the one export that needs Python: LibTorch has no ONNX exporter). `tinygpt export`
// and `tinygpt conform` (for an engine whose hello names one of these formats) both call it.
#pragma once

#include <cstdint>
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

// The weight types a GGUF can be quantized to here (llama.cpp's names) and the values one block holds:
// q8_0 and q4_0 32, q4_K_M 256 (k-quants' super-blocks).
const std::vector<std::string>& gguf_weight_types();
int64_t gguf_block_size(const std::string& weight_type);
// Every 2-D weight's rows (its last dimension: what a GGUF row holds) divisible by the type's blocks;
// std::invalid_argument naming the first tensor that is not (llama-quantize would store it as another
// type without failing), or an unknown type.
void check_quantizable(GPT& model, const std::string& weight_type);
// The model as a GGUF quantized to `weight_type` at `out`, atomically: the float32 GGUF written beside
// it, then `quantizer` (a command line through /bin/sh, called as `quantizer IN OUT TYPE`: llama.cpp's
// llama-quantize, or the llama.cpp adapter's `--quantize`) writes the quantized file. std::runtime_error
// naming the exit status when the quantizer fails; nothing is left at `out` then.
void export_quantized_gguf(GPT& model, const std::string& weight_type, const std::string& quantizer, const std::string& out);

}  // namespace tinygpt::checks
