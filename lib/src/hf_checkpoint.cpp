// Hugging Face checkpoint directories (hf_checkpoint.h). Field names and defaults are transformers
// 5.12's configuration classes (read in the forky chroot); tests/zoo/hf_vs_transformers.py holds the
// result against transformers' own forward for a random model of each class.
#include "tinygpt/hf_checkpoint.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tinygpt/errors.h"
#include "tinygpt/safetensors.h"

namespace tinygpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& dir, const std::string& what) { throw InputError(dir + ": " + what); }

enum class Arch { Llama, Mistral, Qwen3, Gemma2, NeoX };

struct Fields {
  const json& j;
  const std::string& dir;
  bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  template <typename T>
  T get(const char* k, T fallback) const {
    if (!has(k)) return fallback;
    try {
      return j.at(k).get<T>();
    } catch (const json::exception&) {
      fail(dir, std::string("config.json: ") + k + " has the wrong type (" + j.at(k).dump() + ")");
    }
  }
  template <typename T>
  T need(const char* k) const {
    if (!has(k)) fail(dir, std::string("config.json: ") + k + " missing");
    return get<T>(k, T{});
  }
};

// RoPE: transformers 5's rope_parameters, or the older top-level rope_theta / rope_scaling.
void read_rope(const Fields& f, Arch arch, Config& c) {
  json rp = f.has("rope_parameters") ? f.j.at("rope_parameters") : json::object();
  if (!rp.is_object()) fail(f.dir, "config.json: rope_parameters is not an object");
  if (rp.contains("full_attention") || rp.contains("sliding_attention"))
    fail(f.dir, "config.json: rope_parameters per layer type are not supported (one RoPE for every layer)");
  if (f.has("rope_scaling")) rp.update(f.j.at("rope_scaling"));  // older files
  const Fields r{rp, f.dir};
  c.rope_theta = r.get<double>("rope_theta", f.get<double>("rope_theta", f.get<double>("rotary_emb_base", 10000.0)));
  c.partial_rotary = r.get<double>("partial_rotary_factor", f.get<double>("partial_rotary_factor", f.get<double>("rotary_pct", 1.0)));
  c.rope_pairing = RopePairing::Halves;  // rotate_half in every one of the five
  const std::string type = r.get<std::string>("rope_type", r.get<std::string>("type", "default"));
  RopeScaling& s = c.rope_scaling;
  if (type == "default") return;
  if (type == "linear") s.kind = RopeScaling::Kind::Linear;
  else if (type == "llama3") s.kind = RopeScaling::Kind::Llama3;
  else if (type == "yarn") s.kind = RopeScaling::Kind::Yarn;
  else fail(f.dir, "config.json: rope_type '" + type + "' is not supported (default, linear, llama3, yarn)");
  s.factor = r.need<double>("factor");
  s.low_freq_factor = r.get<double>("low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = r.get<double>("high_freq_factor", s.high_freq_factor);
  s.original_context = r.get<int64_t>("original_max_position_embeddings", 0);
  if (s.kind == RopeScaling::Kind::Yarn) {
    if (s.original_context == 0) s.original_context = f.need<int64_t>("max_position_embeddings");
    s.beta_fast = r.get<double>("beta_fast", s.beta_fast);
    s.beta_slow = r.get<double>("beta_slow", s.beta_slow);
    s.truncate = r.get<bool>("truncate", true);
    if (r.has("attention_factor")) s.attention_factor = r.get<double>("attention_factor", 1.0);
    for (const char* k : {"mscale", "mscale_all_dim"})
      if (r.has(k)) fail(f.dir, std::string("config.json: yarn's ") + k + " is not supported");
  }
  (void)arch;
}

Config read_config(const std::string& dir, const json& j, Arch arch) {
  const Fields f{j, dir};
  Config c;
  c.dropout = 0;
  c.vocab_size = f.need<int64_t>("vocab_size");
  c.d_model = f.need<int64_t>("hidden_size");
  c.n_heads = f.need<int64_t>("num_attention_heads");
  c.n_layers = f.need<int64_t>("num_hidden_layers");
  c.context = f.need<int64_t>("max_position_embeddings");
  c.d_ff = f.need<int64_t>("intermediate_size");
  c.n_kv_heads = f.get<int64_t>("num_key_value_heads", c.n_heads);
  if (f.has("head_dim")) c.head_size = f.get<int64_t>("head_dim", 0);
  c.tied_embeddings = f.get<bool>("tie_word_embeddings", arch == Arch::Gemma2);
  read_rope(f, arch, c);
  auto act = [&](const char* key, const std::map<std::string, Activation>& known) {
    const std::string a = f.need<std::string>(key);
    const auto it = known.find(a);
    if (it == known.end()) fail(dir, std::string("config.json: ") + key + " '" + a + "' is not supported for this architecture");
    return it->second;
  };
  if (arch == Arch::NeoX) {
    c.norm = NormKind::LayerNorm;
    c.norm_eps = f.get<double>("layer_norm_eps", 1e-5);
    c.activation = act("hidden_act", {{"gelu", Activation::GeluErf}});
    c.parallel_residual = f.get<bool>("use_parallel_residual", true);
    c.attn_bias = f.get<bool>("attention_bias", true);
    c.mlp_bias = true;
    c.n_kv_heads = c.n_heads;
    c.head_size = 0;
    return c;
  }
  c.norm = arch == Arch::Gemma2 ? NormKind::RMSNormPlusOne : NormKind::RMSNorm;
  c.norm_eps = f.get<double>("rms_norm_eps", 1e-6);
  c.gated_mlp = true;
  c.mlp_bias = false;
  if (f.get<bool>("mlp_bias", false)) fail(dir, "config.json: mlp_bias true is not supported (gated MLPs here have no biases)");
  c.attn_bias = f.get<bool>("attention_bias", false);
  if (f.get<int64_t>("pretraining_tp", 1) != 1) fail(dir, "config.json: pretraining_tp other than 1 is not supported");
  if (arch == Arch::Gemma2) {
    c.activation = act("hidden_activation", {{"gelu_pytorch_tanh", Activation::GeluTanh}});
    c.sandwich_norms = true;
    c.embed_scale = true;
    c.query_pre_attn_scalar = f.need<double>("query_pre_attn_scalar");
    c.attn_softcap = f.get<double>("attn_logit_softcapping", 0.0);
    c.final_softcap = f.get<double>("final_logit_softcapping", 0.0);
    if (f.get<bool>("use_bidirectional_attention", false)) fail(dir, "config.json: use_bidirectional_attention is not supported");
  } else {
    c.activation = act("hidden_act", {{"silu", Activation::Silu}});
  }
  if (arch == Arch::Qwen3) c.qk_norm = true;
  // Windows: Mistral slides every layer when sliding_window is set; the others name each layer.
  if (arch == Arch::Mistral) {
    if (f.has("sliding_window")) {
      c.sliding_window = f.get<int64_t>("sliding_window", 0);
      c.layer_types.assign(static_cast<size_t>(c.n_layers), LayerKind::Sliding);
    }
  } else if (f.has("layer_types")) {
    const auto types = f.get<std::vector<std::string>>("layer_types", {});
    if (static_cast<int64_t>(types.size()) != c.n_layers) fail(dir, "config.json: layer_types does not name every layer");
    bool sliding = false;
    for (const auto& t : types) {
      if (t == "sliding_attention") c.layer_types.push_back(LayerKind::Sliding), sliding = true;
      else if (t == "full_attention") c.layer_types.push_back(LayerKind::Full);
      else fail(dir, "config.json: layer type '" + t + "' is not supported (full_attention, sliding_attention)");
    }
    if (sliding) c.sliding_window = f.need<int64_t>("sliding_window");
    else c.layer_types.clear();
  }
  // A sliding window as long as the context is no window: the seed's rolling rule then holds.
  if (c.sliding_window >= c.context) c.layer_types.clear(), c.sliding_window = 0;
  return c;
}

// The tensors under our names (gpt.h's state dict).
std::vector<std::pair<std::string, at::Tensor>> rename(const std::string& dir, const TensorFile& tf, const Config& c, Arch arch) {
  std::map<std::string, at::Tensor> in;
  for (const auto& [name, t] : tf.tensors) in[name] = t;
  std::set<std::string> used;
  auto take = [&](const std::string& name) {
    const auto it = in.find(name);
    if (it == in.end()) fail(dir, "model.safetensors: tensor " + name + " missing");
    used.insert(name);
    return it->second;
  };
  std::vector<std::pair<std::string, at::Tensor>> out;
  const int64_t H = c.n_heads, G = c.kv_heads(), hd = c.head_dim();
  if (arch == Arch::NeoX) {
    out.emplace_back("emb.weight", take("gpt_neox.embed_in.weight"));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "gpt_neox.layers." + std::to_string(l) + ".", q = "blocks." + std::to_string(l) + ".";
      for (const char* wb : {"weight", "bias"}) {
        out.emplace_back(q + "norm1." + wb, take(p + "input_layernorm." + wb));
        out.emplace_back(q + "norm2." + wb, take(p + "post_attention_layernorm." + wb));
      }
      // query_key_value rows are per head [q k v] (view(..., H, 3 hd)); ours are q | k | v, head-major.
      const at::Tensor w = take(p + "attention.query_key_value.weight");  // (3 H hd, d)
      out.emplace_back(q + "attn.qkv.weight", w.view({H, 3, hd, -1}).transpose(0, 1).reshape({3 * H * hd, -1}).contiguous());
      if (c.attn_bias) {
        const at::Tensor b = take(p + "attention.query_key_value.bias");  // (3 H hd)
        out.emplace_back(q + "attn.qkv.bias", b.view({H, 3, hd}).transpose(0, 1).reshape({3 * H * hd}).contiguous());
        out.emplace_back(q + "attn.out.bias", take(p + "attention.dense.bias"));
      }
      out.emplace_back(q + "attn.out.weight", take(p + "attention.dense.weight"));
      out.emplace_back(q + "mlp.0.weight", take(p + "mlp.dense_h_to_4h.weight"));
      out.emplace_back(q + "mlp.0.bias", take(p + "mlp.dense_h_to_4h.bias"));
      out.emplace_back(q + "mlp.2.weight", take(p + "mlp.dense_4h_to_h.weight"));
      out.emplace_back(q + "mlp.2.bias", take(p + "mlp.dense_4h_to_h.bias"));
    }
    out.emplace_back("norm.weight", take("gpt_neox.final_layer_norm.weight"));
    out.emplace_back("norm.bias", take("gpt_neox.final_layer_norm.bias"));
    out.emplace_back("head.weight", c.tied_embeddings ? out.front().second : take("embed_out.weight"));
  } else {
    out.emplace_back("emb.weight", take("model.embed_tokens.weight"));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".", q = "blocks." + std::to_string(l) + ".";
      out.emplace_back(q + "norm1.weight", take(p + "input_layernorm.weight"));
      if (arch == Arch::Gemma2) {
        out.emplace_back(q + "post_attn_norm.weight", take(p + "post_attention_layernorm.weight"));
        out.emplace_back(q + "norm2.weight", take(p + "pre_feedforward_layernorm.weight"));
        out.emplace_back(q + "post_mlp_norm.weight", take(p + "post_feedforward_layernorm.weight"));
      } else {
        out.emplace_back(q + "norm2.weight", take(p + "post_attention_layernorm.weight"));
      }
      const std::string a = p + "self_attn.";
      out.emplace_back(q + "attn.qkv.weight", at::cat({take(a + "q_proj.weight"), take(a + "k_proj.weight"), take(a + "v_proj.weight")}, 0));
      out.emplace_back(q + "attn.out.weight", take(a + "o_proj.weight"));
      if (c.attn_bias) {
        out.emplace_back(q + "attn.qkv.bias", at::cat({take(a + "q_proj.bias"), take(a + "k_proj.bias"), take(a + "v_proj.bias")}, 0));
        out.emplace_back(q + "attn.out.bias", take(a + "o_proj.bias"));
      }
      if (c.qk_norm) {
        out.emplace_back(q + "attn.q_norm.weight", take(a + "q_norm.weight"));
        out.emplace_back(q + "attn.k_norm.weight", take(a + "k_norm.weight"));
      }
      for (const char* m : {"gate", "up", "down"}) out.emplace_back(q + "mlp." + m + ".weight", take(p + "mlp." + m + "_proj.weight"));
    }
    out.emplace_back("norm.weight", take("model.norm.weight"));
    if (c.tied_embeddings) {
      if (in.count("lm_head.weight")) used.insert("lm_head.weight");  // some writers store the tied copy
      out.emplace_back("head.weight", out.front().second);
    } else {
      out.emplace_back("head.weight", take("lm_head.weight"));
    }
  }
  (void)G;
  for (const auto& [name, t] : in)
    if (!used.count(name)) fail(dir, "model.safetensors: tensor " + name + " is not part of a " + c.to_string() + " model");
  return out;
}

}  // namespace

bool is_hf_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "config.json", ec);
}

Checkpoint read_hf_checkpoint(const std::string& dir) {
  if (!is_hf_directory(dir)) fail(dir, "not a Hugging Face checkpoint directory (no config.json)");
  json j;
  {
    std::ifstream in(fs::path(dir) / "config.json");
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail(dir, std::string("config.json is not JSON: ") + e.what());
    }
  }
  if (!j.is_object()) fail(dir, "config.json is not a JSON object");
  const std::string model_type = j.value("model_type", "");
  std::string archs;
  if (j.contains("architectures") && j.at("architectures").is_array())
    for (const auto& a : j.at("architectures")) archs += (archs.empty() ? "" : ", ") + a.get<std::string>();
  static const std::map<std::string, Arch> types = {
      {"llama", Arch::Llama}, {"mistral", Arch::Mistral}, {"qwen3", Arch::Qwen3}, {"gemma2", Arch::Gemma2}, {"gpt_neox", Arch::NeoX}};
  const auto it = types.find(model_type);
  if (it == types.end())
    fail(dir, "model_type '" + model_type + "'" + (archs.empty() ? "" : " (" + archs + ")") +
                  " is not supported (llama, mistral, qwen3, gemma2, gpt_neox)");
  Checkpoint ck;
  try {
    ck.config = read_config(dir, j, it->second);
    ck.config.validate();
  } catch (const std::invalid_argument& e) {
    fail(dir, std::string("config.json maps to an invalid model: ") + e.what());
  }
  const fs::path st = fs::path(dir) / "model.safetensors";
  if (!fs::exists(st)) {
    if (fs::exists(fs::path(dir) / "model.safetensors.index.json")) fail(dir, "sharded checkpoints are not supported (one model.safetensors)");
    fail(dir, "no model.safetensors");
  }
  const TensorFile tf = read_safetensors(st.string());
  ck.tensors = rename(dir, tf, ck.config, it->second);
  for (const auto& [k, v] : tf.metadata) ck.metadata[k] = v;
  ck.notes.push_back("read as a Hugging Face " + model_type + " checkpoint: " + ck.config.to_string());
  return ck;
}

}  // namespace tinygpt
