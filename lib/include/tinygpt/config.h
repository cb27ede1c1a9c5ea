// The model's hyper-parameters (SPEC 1) and the architecture knobs of the zoo (SPEC 10), with their
// validation. Every knob's default is the seed's architecture, so a Config that sets none of them is
// the series' GPT exactly. Validation throws std::invalid_argument naming the bad field; it never
// clamps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tinygpt {

enum class NormKind {
  LayerNorm,       // (x - mean) / sqrt(var + eps) * w + b: the seed's
  RMSNorm,         // x / sqrt(mean(x^2) + eps) * w, in float32 (Llama, Mistral, Qwen3)
  RMSNormPlusOne,  // x / sqrt(mean(x^2) + eps) * (1 + w), in float32 (Gemma)
};

enum class Activation {
  GeluErf,   // x/2 (1 + erf(x / sqrt 2)): the seed's
  GeluTanh,  // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): Gemma's gelu_pytorch_tanh
  Silu,      // x sigmoid(x): Llama's, Mistral's, Qwen3's
};

// Which channels RoPE turns together: (2j, 2j+1) - ours, SPEC 2, llama.cpp's NORM - or (j, j + r/2) -
// transformers' rotate_half, Llama, Qwen3, Gemma, GPT-NeoX, llama.cpp's NEOX. Pair j turns by f_j.
enum class RopePairing { Adjacent, Halves };

struct RopeScaling {
  enum class Kind { None, Linear, Llama3, Yarn };
  Kind kind = Kind::None;
  double factor = 1;                 // linear, llama3, YaRN: how far the context is stretched
  double low_freq_factor = 1;        // llama3
  double high_freq_factor = 4;       // llama3
  int64_t original_context = 0;      // llama3, YaRN: the context the model was trained at
  double beta_fast = 32;             // YaRN: the correction range's ends, in rotations
  double beta_slow = 1;
  std::optional<double> attention_factor;  // YaRN: given, or 0.1 ln(factor) + 1 (1 when factor <= 1)
  bool truncate = true;              // YaRN: the correction range rounded out to whole dimensions

  bool operator==(const RopeScaling& o) const;
};

// A layer's attention span (SPEC 10): full keeps the seed's rolling window (a decode query sees
// context + 1 keys); sliding lets query i see keys i - w < j <= i, w = Config::sliding_window.
enum class LayerKind { Full, Sliding };

struct Config {
  int64_t vocab_size = 4096;
  int64_t d_model = 256;
  int64_t n_heads = 4;
  int64_t n_layers = 6;
  int64_t context = 256;
  double dropout = 0.1;  // training only; inference never applies it

  // --- Architecture knobs (SPEC 10); the defaults are the seed's ---
  int64_t n_kv_heads = 0;     // 0: n_heads (multi-head); fewer: grouped-query, 1: multi-query
  int64_t head_size = 0;      // 0: d_model / n_heads
  NormKind norm = NormKind::LayerNorm;
  double norm_eps = 1e-5;
  bool sandwich_norms = false;     // Gemma 2: a norm after attention and after the MLP too
  bool parallel_residual = false;  // GPT-NeoX: x + attn(norm1(x)) + mlp(norm2(x))
  Activation activation = Activation::GeluErf;
  bool gated_mlp = false;     // down(act(gate(x)) * up(x)), no biases
  int64_t d_ff = 0;           // 0: 4 d_model
  bool mlp_bias = true;
  bool attn_bias = false;     // biases on the q, k, v and output projections (GPT-NeoX)
  double rope_theta = 10000;
  double partial_rotary = 1.0;  // the rotated fraction of each head
  RopePairing rope_pairing = RopePairing::Adjacent;
  RopeScaling rope_scaling;
  std::vector<LayerKind> layer_types;  // empty: every layer full; else one per layer
  int64_t sliding_window = 0;          // w of the sliding layers (>= 1 when any)
  double attn_softcap = 0;             // 0: none; else c tanh(s / c) on the scaled scores
  double final_softcap = 0;            // 0: none; else on the logits
  double query_pre_attn_scalar = 0;    // 0: the scale is head_dim^-0.5; else this^-0.5 (Gemma 2)
  bool embed_scale = false;            // Gemma: the embedding's output times sqrt(d_model)
  bool qk_norm = false;                // Qwen3: the norm over each head of q and k, before RoPE
  bool tied_embeddings = true;         // the head's weight is the embedding table

  int64_t head_dim() const { return head_size ? head_size : d_model / n_heads; }
  int64_t kv_heads() const { return n_kv_heads ? n_kv_heads : n_heads; }
  int64_t ffn_dim() const { return d_ff ? d_ff : 4 * d_model; }
  // The layer's window in SPEC 10's terms: w for a sliding layer, 0 for a full one.
  int64_t window(int64_t layer) const;
  bool has_sliding() const;
  // How many entries a rolling cache keeps for `layer` before a step (besides kRollbackEntries):
  // context for a full layer, w - 1 for a sliding one.
  int64_t cache_window(int64_t layer) const;

  // The first knob set away from the seed's architecture, by its config name ("n_kv_heads",
  // "norm", ...), or "" for the seed's: what a fast path that implements none names when it refuses.
  std::string zoo_knob() const;
  bool is_seed_architecture() const { return zoo_knob().empty(); }
  // std::invalid_argument("<what>: this path implements the seed's architecture only; the model sets
  // <knob>") unless is_seed_architecture().
  void require_seed_architecture(const std::string& what) const;

  // Throws std::invalid_argument("config: <field> ...") on the first bad field.
  void validate() const;

  bool operator==(const Config& o) const;
  // The seed's six fields, then each knob away from its default.
  std::string to_string() const;
};

const char* to_string(NormKind k);
const char* to_string(Activation a);
const char* to_string(RopePairing p);
const char* to_string(RopeScaling::Kind k);
const char* to_string(LayerKind k);
// The inverse of each to_string; std::invalid_argument naming the known values.
NormKind norm_kind(const std::string& name);
Activation activation_kind(const std::string& name);
RopePairing rope_pairing(const std::string& name);
RopeScaling::Kind rope_scaling_kind(const std::string& name);
LayerKind layer_kind(const std::string& name);

// The config as JSON text: the seed's six fields always, each knob only where it is away from its
// default (so a seed checkpoint's metadata reads as it always did). config_from_json reads that back,
// refusing an unknown key or a value of the wrong type by name (std::invalid_argument), and validates.
std::string config_to_json(const Config& c);
Config config_from_json(const std::string& text);

}  // namespace tinygpt
