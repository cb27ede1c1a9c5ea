// A Hugging Face checkpoint directory (config.json + model.safetensors, or the shards its
// model.safetensors.index.json names; float32, bfloat16 or float16, read into float32 and said in the
// checkpoint's notes) of the architectures SPEC 10's
// knobs cover - LlamaForCausalLM, MistralForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM,
// GPTNeoXForCausalLM - read as a Checkpoint of our names: the config mapped knob by knob (transformers
// 5.12's fields, and the older rope_theta / rope_scaling / rotary_pct spellings), the tensors renamed,
// q, k and v fused into our qkv rows (GPT-NeoX's per-head [q k v] blocks regrouped), RoPE's pairing
// kept as transformers' halves (rope_pairing halves) rather than permuting rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tinygpt/checkpoint.h"

namespace tinygpt {

// Whether `path` is a directory with a config.json.
bool is_hf_directory(const std::string& path);

// InputError naming the directory and the problem: an architecture outside the five, a config field
// whose value no knob expresses (named, with its value), a missing model.safetensors or shard, a
// tensor missing or of the wrong shape. Never approximates.
Checkpoint read_hf_checkpoint(const std::string& dir);

// The ids generation stops at: generation_config.json's eos_token_id (an id or a list), else config.json's;
// empty where neither names one. InputError for a value that is not an id or a list of ids.
std::vector<int64_t> read_hf_stop_ids(const std::string& dir);

// The inverse: `ck` (our names; its config a member of the five) as a Hugging Face directory `dir`
// (config.json + model.safetensors, float32) that transformers loads as that class: the class chosen
// by the knobs (Gemma 2 by its (1 + w) norm, Qwen3 by QK-norm, GPT-NeoX by LayerNorm with parallel
// residual, Mistral by every layer sliding, Llama otherwise). Proven by reading it back: a config that
// class cannot carry (the seed's adjacent RoPE pairs, a soft-cap on a Llama, ...) is refused naming the
// knob it would lose - std::invalid_argument - and nothing is left at `dir`. Refuses an existing `dir`;
// written into a temporary folder beside it and renamed into place.
// `tokenizer_json`, when given, is written as the directory's tokenizer.json (Tokenizer::to_hf_json).
void write_hf_checkpoint(const std::string& dir, const Checkpoint& ck, const std::string& tokenizer_json = "");

}  // namespace tinygpt
