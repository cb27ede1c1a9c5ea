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

#include <unistd.h>

#include "tinygpt/atomic_file.h"
#include "tinygpt/errors.h"
#include "tinygpt/rope_scaling.h"
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
// A sharded checkpoint: model.safetensors.index.json's weight_map names the shard of every tensor; each
// shard (a file name in `dir`, nothing else) is read once and holds the tensors the map gives it.
TensorFile read_shards(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index)) fail(dir, "no model.safetensors (nor model.safetensors.index.json, a sharded checkpoint's index)");
  json j;
  try {
    std::ifstream in(index);
    j = json::parse(in);
  } catch (const std::exception& e) {
    fail(dir, std::string("model.safetensors.index.json is not JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(dir, "model.safetensors.index.json has no weight_map object");
  std::map<std::string, std::set<std::string>> by_shard;  // shard -> the tensors the map gives it
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) fail(dir, "model.safetensors.index.json: weight_map[" + name + "] is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      fail(dir, "model.safetensors.index.json: weight_map[" + name + "] = " + json(f).dump() + " is not a file of the directory");
    by_shard[f].insert(name);
  }
  if (by_shard.empty()) fail(dir, "model.safetensors.index.json: the weight_map is empty");
  TensorFile all;
  for (const auto& [file, names] : by_shard) {
    const fs::path shard = fs::path(dir) / file;
    if (!fs::exists(shard)) fail(dir, "shard " + file + " (named by model.safetensors.index.json) is missing");
    TensorFile part = read_safetensors(shard.string());
    std::set<std::string> found;
    for (auto& [name, t] : part.tensors)
      if (names.count(name)) found.insert(name), all.tensors.emplace_back(name, std::move(t));
    for (const auto& name : names)
      if (!found.count(name)) fail(dir, "shard " + file + " lacks " + name + ", which model.safetensors.index.json puts there");
    for (const auto& [k, v] : part.metadata) all.metadata.emplace(k, v);
  }
  return all;
}

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

std::vector<int64_t> read_hf_stop_ids(const std::string& dir) {
  for (const char* file : {"generation_config.json", "config.json"}) {
    const fs::path p = fs::path(dir) / file;
    if (!fs::exists(p)) continue;
    json j;
    try {
      std::ifstream in(p);
      j = json::parse(in);
    } catch (const std::exception& e) {
      fail(dir, std::string(file) + " is not JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
    const json& e = j["eos_token_id"];
    std::vector<int64_t> ids;
    for (const json& v : e.is_array() ? e : json::array({e})) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(dir, std::string(file) + ": eos_token_id " + e.dump() + " is not an id or a list of ids");
      ids.push_back(v.get<int64_t>());
    }
    return ids;
  }
  return {};
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
  const TensorFile tf = fs::exists(st) ? read_safetensors(st.string()) : read_shards(dir);
  ck.tensors = rename(dir, tf, ck.config, it->second);
  std::set<std::string> stored;  // the dtypes other than float32 the weights came in
  for (const auto& [name, t] : tf.tensors)
    if (t.scalar_type() != at::kFloat) stored.insert(c10::toString(t.scalar_type()));
  for (const auto& d : stored) ck.notes.push_back("weights stored as " + d + ": read into float32 and computed in float32");
  for (const auto& [k, v] : tf.metadata) ck.metadata[k] = v;
  ck.notes.push_back("read as a Hugging Face " + model_type + " checkpoint: " + ck.config.to_string());
  return ck;
}

namespace {

// Which of the five classes carries `c` (the reader's choice, backwards).
Arch arch_for(const Config& c) {
  if (c.norm == NormKind::RMSNormPlusOne) return Arch::Gemma2;
  if (c.norm == NormKind::LayerNorm) return Arch::NeoX;
  if (c.qk_norm) return Arch::Qwen3;
  bool all_sliding = c.has_sliding();
  for (int64_t l = 0; l < c.n_layers; ++l) all_sliding = all_sliding && c.window(l) > 0;
  return all_sliding ? Arch::Mistral : Arch::Llama;
}

json rope_json(const Config& c) {
  json rp = {{"rope_theta", c.rope_theta}};
  if (c.partial_rotary != 1.0) rp["partial_rotary_factor"] = c.partial_rotary;
  const RopeScaling& s = c.rope_scaling;
  switch (s.kind) {
    case RopeScaling::Kind::None: rp["rope_type"] = "default"; break;
    case RopeScaling::Kind::Linear: rp["rope_type"] = "linear"; rp["factor"] = s.factor; break;
    case RopeScaling::Kind::Llama3:
      rp.update({{"rope_type", "llama3"}, {"factor", s.factor}, {"low_freq_factor", s.low_freq_factor},
                 {"high_freq_factor", s.high_freq_factor}, {"original_max_position_embeddings", s.original_context}});
      break;
    case RopeScaling::Kind::Yarn:
      rp.update({{"rope_type", "yarn"}, {"factor", s.factor}, {"original_max_position_embeddings", s.original_context},
                 {"beta_fast", s.beta_fast}, {"beta_slow", s.beta_slow}, {"truncate", s.truncate}});
      if (s.attention_factor) rp["attention_factor"] = *s.attention_factor;
      break;
  }
  return rp;
}

json config_json(const Config& c, Arch arch) {
  static const std::map<Arch, std::pair<const char*, const char*>> names = {
      {Arch::Llama, {"llama", "LlamaForCausalLM"}},   {Arch::Mistral, {"mistral", "MistralForCausalLM"}},
      {Arch::Qwen3, {"qwen3", "Qwen3ForCausalLM"}},   {Arch::Gemma2, {"gemma2", "Gemma2ForCausalLM"}},
      {Arch::NeoX, {"gpt_neox", "GPTNeoXForCausalLM"}}};
  const auto& [type, cls] = names.at(arch);
  json j = {{"model_type", type},
            {"architectures", {cls}},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.d_model},
            {"num_attention_heads", c.n_heads},
            {"num_hidden_layers", c.n_layers},
            {"max_position_embeddings", c.context},
            {"intermediate_size", c.ffn_dim()},
            {"tie_word_embeddings", c.tied_embeddings},
            {"rope_parameters", rope_json(c)},
            {"dtype", "float32"}};
  if (arch == Arch::NeoX) {
    j.update({{"layer_norm_eps", c.norm_eps}, {"hidden_act", c.activation == Activation::GeluErf ? "gelu" : "unsupported"},
              {"use_parallel_residual", c.parallel_residual}, {"attention_bias", c.attn_bias}, {"rotary_pct", c.partial_rotary},
              {"rotary_emb_base", c.rope_theta}});
    return j;
  }
  j.update({{"num_key_value_heads", c.kv_heads()}, {"head_dim", c.head_dim()}, {"rms_norm_eps", c.norm_eps},
            {"attention_bias", c.attn_bias}, {"mlp_bias", false}});
  if (arch == Arch::Gemma2) {
    j["hidden_activation"] = c.activation == Activation::GeluTanh ? "gelu_pytorch_tanh" : "unsupported";
    // transformers' Gemma2Config takes an int here (its dataclass check refuses 64.0).
    const double q = c.query_pre_attn_scalar;
    j["query_pre_attn_scalar"] = q == std::floor(q) ? json(static_cast<int64_t>(q)) : json(q);
    j["attn_logit_softcapping"] = c.attn_softcap > 0 ? json(c.attn_softcap) : json(nullptr);
    j["final_logit_softcapping"] = c.final_softcap > 0 ? json(c.final_softcap) : json(nullptr);
  } else {
    j["hidden_act"] = c.activation == Activation::Silu ? "silu" : "unsupported";
  }
  if (arch == Arch::Mistral) {
    j["sliding_window"] = c.has_sliding() ? json(c.sliding_window) : json(nullptr);
  } else if (c.has_sliding()) {
    json types = json::array();
    for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.window(l) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    j["sliding_window"] = c.sliding_window;
  }
  return j;
}

// Our tensors under the class's names: rename's inverse.
std::vector<std::pair<std::string, at::Tensor>> hf_tensors(const Checkpoint& ck, Arch arch) {
  const Config& c = ck.config;
  std::map<std::string, at::Tensor> in;
  for (const auto& [name, t] : ck.tensors) in[name] = t;
  auto take = [&](const std::string& name) {
    const auto it = in.find(name);
    if (it == in.end()) throw std::invalid_argument("write_hf_checkpoint: tensor " + name + " missing");
    return it->second.to(at::kFloat).contiguous();
  };
  std::vector<std::pair<std::string, at::Tensor>> out;
  const int64_t H = c.n_heads, G = c.kv_heads(), hd = c.head_dim();
  if (arch == Arch::NeoX) {
    out.emplace_back("gpt_neox.embed_in.weight", take("emb.weight"));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "gpt_neox.layers." + std::to_string(l) + ".", q = "blocks." + std::to_string(l) + ".";
      for (const char* wb : {"weight", "bias"}) {
        out.emplace_back(p + "input_layernorm." + wb, take(q + "norm1." + wb));
        out.emplace_back(p + "post_attention_layernorm." + wb, take(q + "norm2." + wb));
      }
      // Ours q | k | v head-major -> per head [q k v].
      out.emplace_back(p + "attention.query_key_value.weight",
                       take(q + "attn.qkv.weight").view({3, H, hd, -1}).transpose(0, 1).reshape({3 * H * hd, -1}).contiguous());
      if (c.attn_bias) {
        out.emplace_back(p + "attention.query_key_value.bias",
                         take(q + "attn.qkv.bias").view({3, H, hd}).transpose(0, 1).reshape({3 * H * hd}).contiguous());
        out.emplace_back(p + "attention.dense.bias", take(q + "attn.out.bias"));
      }
      out.emplace_back(p + "attention.dense.weight", take(q + "attn.out.weight"));
      out.emplace_back(p + "mlp.dense_h_to_4h.weight", take(q + "mlp.0.weight"));
      out.emplace_back(p + "mlp.dense_h_to_4h.bias", take(q + "mlp.0.bias"));
      out.emplace_back(p + "mlp.dense_4h_to_h.weight", take(q + "mlp.2.weight"));
      out.emplace_back(p + "mlp.dense_4h_to_h.bias", take(q + "mlp.2.bias"));
    }
    out.emplace_back("gpt_neox.final_layer_norm.weight", take("norm.weight"));
    out.emplace_back("gpt_neox.final_layer_norm.bias", take("norm.bias"));
    if (!c.tied_embeddings) out.emplace_back("embed_out.weight", take("head.weight"));
    return out;
  }
  out.emplace_back("model.embed_tokens.weight", take("emb.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", q = "blocks." + std::to_string(l) + ".";
    out.emplace_back(p + "input_layernorm.weight", take(q + "norm1.weight"));
    if (arch == Arch::Gemma2) {
      out.emplace_back(p + "post_attention_layernorm.weight", take(q + "post_attn_norm.weight"));
      out.emplace_back(p + "pre_feedforward_layernorm.weight", take(q + "norm2.weight"));
      out.emplace_back(p + "post_feedforward_layernorm.weight", take(q + "post_mlp_norm.weight"));
    } else {
      out.emplace_back(p + "post_attention_layernorm.weight", take(q + "norm2.weight"));
    }
    const std::string a = p + "self_attn.";
    const at::Tensor qkv = take(q + "attn.qkv.weight");  // ((H + 2G) hd, d): q | k | v
    out.emplace_back(a + "q_proj.weight", qkv.narrow(0, 0, H * hd).contiguous());
    out.emplace_back(a + "k_proj.weight", qkv.narrow(0, H * hd, G * hd).contiguous());
    out.emplace_back(a + "v_proj.weight", qkv.narrow(0, (H + G) * hd, G * hd).contiguous());
    out.emplace_back(a + "o_proj.weight", take(q + "attn.out.weight"));
    if (c.attn_bias) {
      const at::Tensor b = take(q + "attn.qkv.bias");
      out.emplace_back(a + "q_proj.bias", b.narrow(0, 0, H * hd).contiguous());
      out.emplace_back(a + "k_proj.bias", b.narrow(0, H * hd, G * hd).contiguous());
      out.emplace_back(a + "v_proj.bias", b.narrow(0, (H + G) * hd, G * hd).contiguous());
      out.emplace_back(a + "o_proj.bias", take(q + "attn.out.bias"));
    }
    if (c.qk_norm) {
      out.emplace_back(a + "q_norm.weight", take(q + "attn.q_norm.weight"));
      out.emplace_back(a + "k_norm.weight", take(q + "attn.k_norm.weight"));
    }
    for (const char* m : {"gate", "up", "down"}) out.emplace_back(p + "mlp." + m + "_proj.weight", take(q + "mlp." + m + ".weight"));
  }
  out.emplace_back("model.norm.weight", take("norm.weight"));
  if (!c.tied_embeddings) out.emplace_back("lm_head.weight", take("head.weight"));
  return out;
}

// The same model's config with every default spelled out (d_ff 0 is 4 d, n_kv_heads 0 is H, ...), so
// two spellings of one model compare equal.
Config spelled_out(Config c) {
  c.d_ff = c.ffn_dim();
  c.n_kv_heads = c.kv_heads();
  c.head_size = c.head_dim();
  c.dropout = 0;
  if (c.rope_scaling.kind == RopeScaling::Kind::Yarn && !c.rope_scaling.attention_factor)
    c.rope_scaling.attention_factor = rope_attention_factor(rope_spec(c));
  return c;
}

// The first knob whose value differs between `a` (ours) and `b` (read back), by its config name.
std::string lost_knob(const Config& a, const Config& b) {
  const json x = json::parse(config_to_json(spelled_out(a))), y = json::parse(config_to_json(spelled_out(b)));
  for (const auto& [k, v] : x.items())
    if (!y.contains(k) || y.at(k) != v) return k + " = " + v.dump();
  for (const auto& [k, v] : y.items())
    if (!x.contains(k)) return k + " (read back as " + v.dump() + ")";
  return "";
}

}  // namespace

void write_hf_checkpoint(const std::string& dir, const Checkpoint& ck, const std::string& tokenizer_json) {
  std::error_code ec;
  if (fs::exists(dir, ec)) throw std::invalid_argument(dir + ": exists; write_hf_checkpoint writes a new directory");
  const Config& c = ck.config;
  c.validate();
  if (c.rope_pairing != RopePairing::Halves)
    throw std::invalid_argument("a Hugging Face directory needs rope_pairing halves (rotate_half); this model pairs adjacent channels "
                                "(the seed's RoPE): rope_pairing = adjacent cannot be carried");
  const Arch arch = arch_for(c);
  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.parent_path() / (final_dir.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  struct Cleanup {
    fs::path p;
    bool keep = false;
    ~Cleanup() {
      std::error_code e;
      if (!keep) fs::remove_all(p, e);
    }
  } cleanup{tmp};
  write_text_atomically((tmp / "config.json").string(), config_json(c, arch).dump(2) + "\n");
  write_safetensors((tmp / "model.safetensors").string(), hf_tensors(ck, arch), {{"format", "pt"}});
  if (!tokenizer_json.empty()) write_text_atomically((tmp / "tokenizer.json").string(), tokenizer_json);
  // Read back: what the class cannot carry shows as a knob that changed, or a tensor that did.
  const Checkpoint back = read_hf_checkpoint(tmp.string());
  const std::string lost = lost_knob(c, back.config);
  if (!lost.empty())
    throw std::invalid_argument(std::string("a Hugging Face ") + config_json(c, arch).at("architectures")[0].get<std::string>() +
                                " cannot carry this model's " + lost);
  std::map<std::string, at::Tensor> mine;
  for (const auto& [name, t] : ck.tensors) mine[name] = t;
  for (const auto& [name, t] : back.tensors)
    if (!mine.count(name) || !mine.at(name).to(at::kFloat).equal(t))
      throw std::invalid_argument("write_hf_checkpoint: tensor " + name + " does not read back equal");
  fs::rename(tmp, final_dir);
  cleanup.keep = true;
}

}  // namespace tinygpt
