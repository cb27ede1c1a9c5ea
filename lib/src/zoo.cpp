#include "tinygpt/zoo.h"

#include <stdexcept>

namespace tinygpt {

const std::vector<std::string>& zoo_names() {
  static const std::vector<std::string> names = {"llama", "mqa", "mistral", "gemma2", "qwen3", "neox"};
  return names;
}

namespace {
// Llama's family: RMSNorm, SwiGLU without biases, RoPE over halves.
Config llama_like(int64_t d, int64_t heads, int64_t kv_heads, int64_t layers) {
  Config c;
  c.d_model = d, c.n_heads = heads, c.n_kv_heads = kv_heads, c.n_layers = layers;
  c.norm = NormKind::RMSNorm;
  c.norm_eps = 1e-5;
  c.activation = Activation::Silu;
  c.gated_mlp = true;
  c.mlp_bias = false;
  c.d_ff = 8 * d / 3 / 32 * 32;  // Llama's 8d/3, rounded down to a multiple of 32
  c.rope_pairing = RopePairing::Halves;
  return c;
}
}  // namespace

Config draft_config() {
  Config c;
  c.d_model = 128;
  c.n_layers = 2;
  return c;
}

Config zoo_config(const std::string& name) {
  Config c;
  if (name == "llama") {  // GQA 8:2, llama3 scaling from an original context of 128: it acts inside our window
    c = llama_like(192, 8, 2, 3);
    c.rope_scaling.kind = RopeScaling::Kind::Llama3;
    c.rope_scaling.factor = 4;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_context = 128;
    c.tied_embeddings = false;
  } else if (name == "mqa") {  // one KV head for four query heads
    c = llama_like(128, 4, 1, 3);
  } else if (name == "mistral") {  // every layer sliding, w = 64
    c = llama_like(128, 4, 2, 3);
    c.layer_types.assign(3, LayerKind::Sliding);
    c.sliding_window = 64;
  } else if (name == "gemma2") {  // alternating sliding 64 / full, both soft-caps, (1 + w) sandwich norms, GeGLU, tied
    c = llama_like(128, 4, 2, 4);
    c.head_size = 48;  // Gemma's head size is its own, not d / H
    c.norm = NormKind::RMSNormPlusOne;
    c.norm_eps = 1e-6;
    c.sandwich_norms = true;
    c.activation = Activation::GeluTanh;
    c.d_ff = 384;
    c.layer_types = {LayerKind::Sliding, LayerKind::Full, LayerKind::Sliding, LayerKind::Full};
    c.sliding_window = 64;
    c.attn_softcap = 20;  // small enough to bind on this model's scores (Gemma 2's own: 50)
    c.final_softcap = 15;  // (Gemma 2's own: 30)
    c.query_pre_attn_scalar = 64;  // the scale 64^-0.5, not head_size^-0.5
    c.embed_scale = true;
  } else if (name == "qwen3") {  // QK-norm, GQA, YaRN factor 4 from an original context of 64
    c = llama_like(128, 4, 2, 3);
    c.norm_eps = 1e-6;
    c.qk_norm = true;
    c.rope_theta = 1000000;
    c.rope_scaling.kind = RopeScaling::Kind::Yarn;
    c.rope_scaling.factor = 4;
    c.rope_scaling.original_context = 64;
  } else if (name == "neox") {  // Pythia: partial rotary 25%, parallel residual, LayerNorm and biases, untied
    c.d_model = 128, c.n_heads = 4, c.n_layers = 3;
    c.partial_rotary = 0.25;
    c.rope_pairing = RopePairing::Halves;
    c.parallel_residual = true;
    c.attn_bias = true;
    c.tied_embeddings = false;
  } else {
    std::string known;
    for (const auto& n : zoo_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("zoo: no member '" + name + "' (" + known + ")");
  }
  c.validate();
  return c;
}

}  // namespace tinygpt
