// Our model as a GGUF file for llama.cpp (GGUF version 3, F32): the seed's model as its `gptneox`
// architecture, zoo members (SPEC 10) as llama, qwen3, gemma2 or gptneox; and a reader of what it wrote. GGUF is small and documented (ggml's docs/gguf.md): a header, typed
// key-value metadata, tensor infos, then aligned tensor data. Written here rather than through
// ggml's gguf API so that exporting needs nothing beyond this library.
//
// The mapping (docs/engines.md, checked in llama.cpp's gptneox loader): emb -> token_embd and a
// copy as output (gptneox has no tied-output fallback); norms, qkv, out and the MLP by name; zero
// biases for qkv and attn_output (the loader requires them); q and k rows permuted per head so
// llama.cpp's rotate-half RoPE (NeoX) computes our interleaved-pair RoPE exactly: for head h and
// j < hd/2, new row h*hd + j = old h*hd + 2j and new row h*hd + hd/2 + j = old h*hd + 2j + 1 (the same
// permutation on q and k leaves every q.k unchanged).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tinygpt/gpt.h"

namespace tinygpt {

// The llama.cpp architecture whose graph computes `c`: gptneox for the seed's model (and a LayerNorm
// model: Pythia's), gemma2 for Gemma 2's knobs, qwen3 for QK-norm, llama for the rest of Llama's family.
// std::invalid_argument("GGUF export: llama.cpp's <arch> architecture cannot carry this model's <knob>")
// for a model none of them computes. A sliding window on llama is written but not read by llama.cpp's
// llama graph (docs/engines.md: a finding, left visible).
std::string gguf_architecture(const Config& c);

// Writes `model` to `path` (atomically) as gguf_architecture(config) lays it out: the q/k rows of
// each head reordered where the architecture's RoPE pairs channels otherwise than the model (llama
// turns adjacent pairs, the others halves), Gemma's norms stored as 1 + w, Gemma 2's
// query_pre_attn_scalar folded into q's rows (llama.cpp scales by head_dim^-0.5), llama3 scaling as a
// rope_freqs tensor. Throws std::invalid_argument (above) or std::runtime_error naming the path.
void write_gguf(const std::string& path, GPT& model, const std::string& name = "tinygpt");

// q/k row permutation of one (3d, d) qkv weight (or (3d) bias), and its inverse: (3d, ...) -> (3d, ...).
at::Tensor permute_qk_rows(const at::Tensor& qkv, int64_t n_heads, bool inverse = false);

// What a GGUF file holds, as read back: metadata (each value rendered as text) and tensors (shapes as
// PyTorch orders them: the reverse of ggml's ne). Throws InputError naming the path on a malformed file.
struct GgufFile {
  uint32_t version = 0;
  std::map<std::string, std::string> metadata;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // F32 only
};
GgufFile read_gguf(const std::string& path);

}  // namespace tinygpt
