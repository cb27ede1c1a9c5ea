#include "tinygpt/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace tinygpt {

namespace {
std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

void require(bool ok, const std::string& field, const std::string& why, double got) {
  if (!ok) throw std::invalid_argument("config: " + field + " " + why + " (got " + num(got) + ")");
}

template <typename E, size_t N>
E from_name(const std::string& name, const E (&all)[N], const char* what) {
  std::string known;
  for (E e : all) {
    if (name == to_string(e)) return e;
    known += (known.empty() ? "" : ", ") + std::string(to_string(e));
  }
  throw std::invalid_argument(std::string("config: unknown ") + what + " '" + name + "' (" + known + ")");
}

constexpr NormKind kNorms[] = {NormKind::LayerNorm, NormKind::RMSNorm, NormKind::RMSNormPlusOne};
constexpr Activation kActs[] = {Activation::GeluErf, Activation::GeluTanh, Activation::Silu};
constexpr RopePairing kPairings[] = {RopePairing::Adjacent, RopePairing::Halves};
constexpr RopeScaling::Kind kScalings[] = {RopeScaling::Kind::None, RopeScaling::Kind::Linear, RopeScaling::Kind::Llama3,
                                           RopeScaling::Kind::Yarn};
constexpr LayerKind kLayers[] = {LayerKind::Full, LayerKind::Sliding};
}  // namespace

const char* to_string(NormKind k) {
  switch (k) {
    case NormKind::RMSNorm: return "rmsnorm";
    case NormKind::RMSNormPlusOne: return "rmsnorm_plus_one";
    default: return "layernorm";
  }
}
const char* to_string(Activation a) {
  switch (a) {
    case Activation::GeluTanh: return "gelu_tanh";
    case Activation::Silu: return "silu";
    default: return "gelu";
  }
}
const char* to_string(RopePairing p) { return p == RopePairing::Halves ? "halves" : "adjacent"; }
const char* to_string(RopeScaling::Kind k) {
  switch (k) {
    case RopeScaling::Kind::Linear: return "linear";
    case RopeScaling::Kind::Llama3: return "llama3";
    case RopeScaling::Kind::Yarn: return "yarn";
    default: return "none";
  }
}
const char* to_string(LayerKind k) { return k == LayerKind::Sliding ? "sliding" : "full"; }

NormKind norm_kind(const std::string& n) { return from_name(n, kNorms, "norm"); }
Activation activation_kind(const std::string& n) { return from_name(n, kActs, "activation"); }
RopePairing rope_pairing(const std::string& n) { return from_name(n, kPairings, "rope_pairing"); }
RopeScaling::Kind rope_scaling_kind(const std::string& n) { return from_name(n, kScalings, "rope scaling"); }
LayerKind layer_kind(const std::string& n) { return from_name(n, kLayers, "layer type"); }

bool RopeScaling::operator==(const RopeScaling& o) const {
  return kind == o.kind && factor == o.factor && low_freq_factor == o.low_freq_factor && high_freq_factor == o.high_freq_factor &&
         original_context == o.original_context && beta_fast == o.beta_fast && beta_slow == o.beta_slow &&
         attention_factor == o.attention_factor && truncate == o.truncate;
}

int64_t Config::window(int64_t layer) const {
  if (layer < 0 || layer >= n_layers) throw std::out_of_range("config: layer " + std::to_string(layer) + " out of range");
  return !layer_types.empty() && layer_types[static_cast<size_t>(layer)] == LayerKind::Sliding ? sliding_window : 0;
}

bool Config::has_sliding() const {
  for (auto k : layer_types)
    if (k == LayerKind::Sliding) return true;
  return false;
}

int64_t Config::cache_window(int64_t layer) const {
  const int64_t w = window(layer);
  return w ? w - 1 : context;
}

namespace {
// The knobs written as plain JSON values, by config name: the writer and the reader both walk this
// list, so a knob cannot be written under one name and read under another. The enums, rope_scaling
// and layer_types (with sliding_window) are written out below.
template <typename C, typename F>
void plain_knobs(C& c, F&& f) {
  f("n_kv_heads", c.n_kv_heads);
  f("head_size", c.head_size);
  f("norm_eps", c.norm_eps);
  f("sandwich_norms", c.sandwich_norms);
  f("parallel_residual", c.parallel_residual);
  f("gated_mlp", c.gated_mlp);
  f("d_ff", c.d_ff);
  f("mlp_bias", c.mlp_bias);
  f("attn_bias", c.attn_bias);
  f("rope_theta", c.rope_theta);
  f("partial_rotary", c.partial_rotary);
  f("attn_softcap", c.attn_softcap);
  f("final_softcap", c.final_softcap);
  f("query_pre_attn_scalar", c.query_pre_attn_scalar);
  f("embed_scale", c.embed_scale);
  f("qk_norm", c.qk_norm);
  f("tied_embeddings", c.tied_embeddings);
}

// `c` with every knob that restates the seed's value (n_kv_heads = n_heads, ...) put back at its default.
Config normalized(Config c) {
  if (c.n_kv_heads == c.n_heads) c.n_kv_heads = 0;
  if (c.head_size == c.d_model / c.n_heads && c.d_model % c.n_heads == 0) c.head_size = 0;
  if (c.d_ff == 4 * c.d_model) c.d_ff = 0;
  if (c.query_pre_attn_scalar == static_cast<double>(c.head_dim())) c.query_pre_attn_scalar = 0;
  if (!c.has_sliding()) c.layer_types.clear();
  return c;
}

// Every knob away from its default, in config-file form; the seed's yields an empty object.
nlohmann::json knobs_json(const Config& given) {
  const Config c = normalized(given), s;
  nlohmann::json j = nlohmann::json::object();
  nlohmann::json have, dflt;
  plain_knobs(c, [&](const char* name, const auto& v) { have[name] = v; });
  plain_knobs(s, [&](const char* name, const auto& v) { dflt[name] = v; });
  for (const auto& [k, v] : have.items())
    if (v != dflt[k]) j[k] = v;
  if (c.norm != s.norm) j["norm"] = to_string(c.norm);
  if (c.activation != s.activation) j["activation"] = to_string(c.activation);
  if (c.rope_pairing != s.rope_pairing) j["rope_pairing"] = to_string(c.rope_pairing);
  if (!(c.rope_scaling == s.rope_scaling)) {
    const RopeScaling& r = c.rope_scaling;
    nlohmann::json rs = {{"kind", to_string(r.kind)}, {"factor", r.factor}};
    if (r.kind == RopeScaling::Kind::Llama3)
      rs.update({{"low_freq_factor", r.low_freq_factor}, {"high_freq_factor", r.high_freq_factor}});
    if (r.kind == RopeScaling::Kind::Llama3 || r.kind == RopeScaling::Kind::Yarn) rs["original_context"] = r.original_context;
    if (r.kind == RopeScaling::Kind::Yarn) {
      rs.update({{"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow}, {"truncate", r.truncate}});
      if (r.attention_factor) rs["attention_factor"] = *r.attention_factor;
    }
    j["rope_scaling"] = rs;
  }
  if (c.has_sliding()) {
    nlohmann::json types = nlohmann::json::array();
    for (auto k : c.layer_types) types.push_back(to_string(k));
    j["layer_types"] = types;
    j["sliding_window"] = c.sliding_window;
  }
  return j;
}
}  // namespace

std::string Config::zoo_knob() const {
  const nlohmann::json knobs = knobs_json(*this);
  return knobs.empty() ? "" : knobs.begin().key();  // the first by name
}

void Config::require_seed_architecture(const std::string& what) const {
  const std::string knob = zoo_knob();
  if (!knob.empty())
    throw std::invalid_argument(what + ": implements the seed's architecture only; this model sets " + knob + " (SPEC 10)");
}

void Config::validate() const {
  require(vocab_size >= 2, "vocab_size", "must be at least 2", double(vocab_size));
  require(d_model >= 2, "d_model", "must be at least 2", double(d_model));
  require(n_heads >= 1, "n_heads", "must be at least 1", double(n_heads));
  require(head_size >= 0, "head_size", "must be >= 0 (0: d_model / n_heads)", double(head_size));
  if (head_size == 0)
    require(d_model % n_heads == 0, "d_model", "must be divisible by n_heads=" + std::to_string(n_heads), double(d_model));
  require(head_dim() % 2 == 0, head_size ? "head_size" : "n_heads", "must leave an even head_dim for RoPE", double(head_dim()));
  require(n_kv_heads >= 0, "n_kv_heads", "must be >= 0 (0: n_heads)", double(n_kv_heads));
  require(n_heads % kv_heads() == 0, "n_kv_heads", "must divide n_heads=" + std::to_string(n_heads), double(n_kv_heads));
  require(n_layers >= 1, "n_layers", "must be at least 1", double(n_layers));
  require(context >= 1, "context", "must be at least 1", double(context));
  require(std::isfinite(dropout) && dropout >= 0.0 && dropout < 1.0, "dropout", "must be in [0, 1)", dropout);
  require(std::isfinite(norm_eps) && norm_eps > 0, "norm_eps", "must be > 0", norm_eps);
  require(!(sandwich_norms && parallel_residual), "sandwich_norms", "cannot be combined with parallel_residual", 1);
  require(d_ff >= 0, "d_ff", "must be >= 0 (0: 4 d_model)", double(d_ff));
  require(!(gated_mlp && mlp_bias), "mlp_bias", "must be off for a gated MLP (no gated model here has MLP biases)", 1);
  require(std::isfinite(rope_theta) && rope_theta > 1, "rope_theta", "must be > 1", rope_theta);
  require(partial_rotary > 0 && partial_rotary <= 1, "partial_rotary", "must be in (0, 1]", partial_rotary);
  const auto rotated = static_cast<int64_t>(static_cast<double>(head_dim()) * partial_rotary);
  require(rotated >= 2 && rotated % 2 == 0, "partial_rotary", "must leave an even rotated width head_dim x partial_rotary >= 2",
          double(rotated));
  require(rope_scaling.kind == RopeScaling::Kind::None || rope_scaling.factor > 0, "rope_scaling.factor", "must be > 0",
          rope_scaling.factor);
  if (rope_scaling.kind == RopeScaling::Kind::Llama3 || rope_scaling.kind == RopeScaling::Kind::Yarn)
    require(rope_scaling.original_context >= 1, "rope_scaling.original_context", "must be >= 1 for " +
            std::string(tinygpt::to_string(rope_scaling.kind)), double(rope_scaling.original_context));
  if (rope_scaling.kind == RopeScaling::Kind::Llama3)
    require(rope_scaling.low_freq_factor > 0 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor,
            "rope_scaling.high_freq_factor", "must exceed low_freq_factor > 0", rope_scaling.high_freq_factor);
  if (rope_scaling.kind == RopeScaling::Kind::Yarn) {
    require(rope_scaling.beta_slow > 0 && rope_scaling.beta_fast > rope_scaling.beta_slow, "rope_scaling.beta_fast",
            "must exceed beta_slow > 0", rope_scaling.beta_fast);
    require(!rope_scaling.attention_factor || *rope_scaling.attention_factor > 0, "rope_scaling.attention_factor", "must be > 0",
            rope_scaling.attention_factor.value_or(0));
  }
  require(layer_types.empty() || static_cast<int64_t>(layer_types.size()) == n_layers, "layer_types",
          "must name every layer (n_layers=" + std::to_string(n_layers) + ")", double(layer_types.size()));
  if (has_sliding())
    require(sliding_window >= 1 && sliding_window <= context, "sliding_window",
            "must be in [1, context=" + std::to_string(context) + "] when a layer slides", double(sliding_window));
  else
    require(sliding_window == 0, "sliding_window", "is set but no layer in layer_types is sliding", double(sliding_window));
  require(std::isfinite(attn_softcap) && attn_softcap >= 0, "attn_softcap", "must be >= 0 (0: none)", attn_softcap);
  require(std::isfinite(final_softcap) && final_softcap >= 0, "final_softcap", "must be >= 0 (0: none)", final_softcap);
  require(std::isfinite(query_pre_attn_scalar) && query_pre_attn_scalar >= 0, "query_pre_attn_scalar", "must be >= 0 (0: head_dim)",
          query_pre_attn_scalar);
  require(!(qk_norm && norm == NormKind::LayerNorm), "qk_norm", "needs an RMS norm (norm rmsnorm or rmsnorm_plus_one)", 1);
}

bool Config::operator==(const Config& o) const {
  return vocab_size == o.vocab_size && d_model == o.d_model && n_heads == o.n_heads && n_layers == o.n_layers &&
         context == o.context && dropout == o.dropout && kv_heads() == o.kv_heads() && head_dim() == o.head_dim() &&
         norm == o.norm && norm_eps == o.norm_eps && sandwich_norms == o.sandwich_norms && parallel_residual == o.parallel_residual &&
         activation == o.activation && gated_mlp == o.gated_mlp && ffn_dim() == o.ffn_dim() && mlp_bias == o.mlp_bias &&
         attn_bias == o.attn_bias && rope_theta == o.rope_theta && partial_rotary == o.partial_rotary &&
         rope_pairing == o.rope_pairing && rope_scaling == o.rope_scaling && layer_types == o.layer_types &&
         sliding_window == o.sliding_window && attn_softcap == o.attn_softcap && final_softcap == o.final_softcap &&
         query_pre_attn_scalar == o.query_pre_attn_scalar && embed_scale == o.embed_scale && qk_norm == o.qk_norm &&
         tied_embeddings == o.tied_embeddings;
}

std::string Config::to_string() const {
  std::ostringstream s;
  s << "vocab_size=" << vocab_size << " d_model=" << d_model << " n_heads=" << n_heads << " n_layers=" << n_layers
    << " context=" << context << " dropout=" << dropout;
  const nlohmann::json knobs = knobs_json(*this);  // alive for the loop: items() refers to it
  for (const auto& [k, v] : knobs.items()) s << " " << k << "=" << (v.is_string() ? v.get<std::string>() : v.dump());
  return s.str();
}

std::string config_to_json(const Config& c) {
  nlohmann::json j = {{"vocab_size", c.vocab_size}, {"d_model", c.d_model}, {"n_heads", c.n_heads},
                      {"n_layers", c.n_layers},     {"context", c.context}, {"dropout", c.dropout}};
  j.update(knobs_json(c));
  return j.dump();
}

Config config_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("config: not JSON: ") + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument("config: not a JSON object");
  Config c;
  auto get = [&](const nlohmann::json& from, const char* key, auto* out, const std::string& prefix = "") {
    if (!from.contains(key)) return false;
    try {
      *out = from.at(key).get<std::remove_pointer_t<decltype(out)>>();
    } catch (const nlohmann::json::exception&) {
      throw std::invalid_argument("config: " + prefix + key + " has the wrong type (" + from.at(key).dump() + ")");
    }
    return true;
  };
  for (const char* k : {"vocab_size", "d_model", "n_heads", "n_layers", "context"}) {
    int64_t v = 0;
    if (!get(j, k, &v)) throw std::invalid_argument(std::string("config: ") + k + " missing");
  }
  get(j, "vocab_size", &c.vocab_size);
  get(j, "d_model", &c.d_model);
  get(j, "n_heads", &c.n_heads);
  get(j, "n_layers", &c.n_layers);
  get(j, "context", &c.context);
  get(j, "dropout", &c.dropout);
  std::vector<std::string> known = {"vocab_size", "d_model", "n_heads", "n_layers", "context", "dropout", "norm", "activation",
                                    "rope_pairing", "rope_scaling", "layer_types", "sliding_window"};
  plain_knobs(c, [&](const char* name, auto& v) {
    get(j, name, &v);
    known.push_back(name);
  });
  std::string name;
  if (get(j, "norm", &name)) c.norm = norm_kind(name);
  if (get(j, "activation", &name)) c.activation = activation_kind(name);
  if (get(j, "rope_pairing", &name)) c.rope_pairing = rope_pairing(name);
  if (j.contains("rope_scaling")) {
    const auto& rs = j.at("rope_scaling");
    if (!rs.is_object()) throw std::invalid_argument("config: rope_scaling must be an object");
    RopeScaling& r = c.rope_scaling;
    if (!get(rs, "kind", &name, "rope_scaling.")) throw std::invalid_argument("config: rope_scaling.kind missing");
    r.kind = rope_scaling_kind(name);
    get(rs, "factor", &r.factor, "rope_scaling.");
    get(rs, "low_freq_factor", &r.low_freq_factor, "rope_scaling.");
    get(rs, "high_freq_factor", &r.high_freq_factor, "rope_scaling.");
    get(rs, "original_context", &r.original_context, "rope_scaling.");
    get(rs, "beta_fast", &r.beta_fast, "rope_scaling.");
    get(rs, "beta_slow", &r.beta_slow, "rope_scaling.");
    get(rs, "truncate", &r.truncate, "rope_scaling.");
    double af = 0;
    if (get(rs, "attention_factor", &af, "rope_scaling.")) r.attention_factor = af;
    for (const auto& [k, v] : rs.items())
      if (k != "kind" && k != "factor" && k != "low_freq_factor" && k != "high_freq_factor" && k != "original_context" &&
          k != "beta_fast" && k != "beta_slow" && k != "truncate" && k != "attention_factor")
        throw std::invalid_argument("config: unknown key rope_scaling." + k);
  }
  if (j.contains("layer_types")) {
    std::vector<std::string> types;
    get(j, "layer_types", &types);
    for (const auto& t : types) c.layer_types.push_back(layer_kind(t));
  }
  get(j, "sliding_window", &c.sliding_window);
  for (const auto& [k, v] : j.items())
    if (std::find(known.begin(), known.end(), k) == known.end()) throw std::invalid_argument("config: unknown key " + k);
  c.validate();
  return c;
}

}  // namespace tinygpt
