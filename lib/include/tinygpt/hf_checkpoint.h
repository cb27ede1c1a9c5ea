// A Hugging Face checkpoint directory (config.json + model.safetensors) of the architectures SPEC 10's
// knobs cover - LlamaForCausalLM, MistralForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM,
// GPTNeoXForCausalLM - read as a Checkpoint of our names: the config mapped knob by knob (transformers
// 5.12's fields, and the older rope_theta / rope_scaling / rotary_pct spellings), the tensors renamed,
// q, k and v fused into our qkv rows (GPT-NeoX's per-head [q k v] blocks regrouped), RoPE's pairing
// kept as transformers' halves (rope_pairing halves) rather than permuting rows.
#pragma once

#include <string>

#include "tinygpt/checkpoint.h"

namespace tinygpt {

// Whether `path` is a directory with a config.json.
bool is_hf_directory(const std::string& path);

// InputError naming the directory and the problem: an architecture outside the five, a config field
// whose value no knob expresses (named, with its value), a sharded or missing model.safetensors, a
// tensor missing or of the wrong shape. Never approximates.
Checkpoint read_hf_checkpoint(const std::string& dir);

}  // namespace tinygpt
