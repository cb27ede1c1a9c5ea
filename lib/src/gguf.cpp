#include "tinygpt/gguf.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tinygpt/atomic_file.h"
#include "tinygpt/errors.h"
#include "tinygpt/rope_scaling.h"

namespace tinygpt {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;      // general.alignment's default
enum ValueType : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12 };
constexpr uint32_t kGgmlF32 = 0;

class Writer {
 public:
  explicit Writer(std::ostream& out) : out_(out) {}
  template <typename T>
  void raw(T v) {
    out_.write(reinterpret_cast<const char*>(&v), sizeof v);
    pos_ += sizeof v;
  }
  void str(const std::string& s) {
    raw<uint64_t>(s.size());
    out_.write(s.data(), static_cast<std::streamsize>(s.size()));
    pos_ += s.size();
  }
  void bytes(const void* p, uint64_t n) {
    out_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    pos_ += n;
  }
  void pad() {
    while (pos_ % kAlignment) raw<uint8_t>(0);
  }

 private:
  std::ostream& out_;
  uint64_t pos_ = 0;
};

struct Kv {
  std::string key;
  uint32_t type;
  std::string s;
  uint64_t u = 0;
  float f = 0;
};

// The file: header, metadata, tensor infos, then each tensor's data aligned (written atomically).
void write_file(const std::string& path, const std::vector<Kv>& kv, const std::vector<std::pair<std::string, at::Tensor>>& t) {
  write_atomically(path, [&](std::ostream& out) {
    Writer w(out);
    w.raw<uint32_t>(kMagic);
    w.raw<uint32_t>(kVersion);
    w.raw<uint64_t>(t.size());
    w.raw<uint64_t>(kv.size());
    for (const auto& e : kv) {
      w.str(e.key);
      w.raw<uint32_t>(e.type);
      switch (e.type) {
        case kString: w.str(e.s); break;
        case kU32: w.raw<uint32_t>(static_cast<uint32_t>(e.u)); break;
        case kF32: w.raw<float>(e.f); break;
        case kBool: w.raw<uint8_t>(static_cast<uint8_t>(e.u)); break;
        default: throw std::logic_error("write_gguf: unhandled metadata type");
      }
    }
    uint64_t offset = 0;
    for (const auto& [n, x] : t) {
      w.str(n);
      w.raw<uint32_t>(static_cast<uint32_t>(x.dim()));
      for (int64_t k = x.dim() - 1; k >= 0; --k) w.raw<uint64_t>(static_cast<uint64_t>(x.size(k)));  // ggml ne: fastest first
      w.raw<uint32_t>(kGgmlF32);
      w.raw<uint64_t>(offset);
      offset += (static_cast<uint64_t>(x.numel()) * 4 + kAlignment - 1) / kAlignment * kAlignment;
    }
    w.pad();
    for (const auto& [n, x] : t) {
      w.bytes(x.data_ptr<float>(), static_cast<uint64_t>(x.numel()) * 4);
      w.pad();
    }
  });
}

[[noreturn]] void cannot(const std::string& arch, const std::string& knob) {
  throw std::invalid_argument("GGUF export: llama.cpp's " + arch + " architecture cannot carry this model's " + knob);
}

// Each head's first `rotated` rows (of `heads` heads of hd rows) reordered between RoPE's two pairings:
// to adjacent, new 2j = old j and new 2j + 1 = old j + r/2; to halves, the inverse. w: (heads hd, ...)
// or (heads hd); the same shape back.
at::Tensor repair(const at::Tensor& w, int64_t heads, int64_t hd, int64_t rotated, bool to_adjacent) {
  std::vector<int64_t> idx(static_cast<size_t>(heads * hd));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < hd; ++i) idx[h * hd + i] = h * hd + i;
    for (int64_t j = 0; j < rotated / 2; ++j) {
      const int64_t half = h * hd + j, other = h * hd + rotated / 2 + j, even = h * hd + 2 * j, odd = even + 1;
      if (to_adjacent) idx[even] = half, idx[odd] = other;
      else idx[half] = even, idx[other] = odd;
    }
  }
  return w.index_select(0, at::tensor(idx, at::kLong)).contiguous();
}

}  // namespace

at::Tensor permute_qk_rows(const at::Tensor& qkv, int64_t n_heads, bool inverse) {
  const int64_t d3 = qkv.size(0), d = d3 / 3, hd = d / n_heads;
  if (d3 % 3 != 0 || d % n_heads != 0 || hd % 2 != 0) throw std::invalid_argument("permute_qk_rows: not a (3d, ...) qkv with even heads");
  auto part = [&](int64_t i) { return qkv.narrow(0, i * d, d); };
  return at::cat({repair(part(0), n_heads, hd, hd, inverse), repair(part(1), n_heads, hd, hd, inverse), part(2)});
}

std::string gguf_architecture(const Config& c) {
  const bool gemma = c.norm == NormKind::RMSNormPlusOne || c.sandwich_norms || c.attn_softcap > 0 || c.final_softcap > 0 || c.embed_scale;
  const std::string arch = gemma ? "gemma2" : c.norm == NormKind::LayerNorm ? "gptneox" : c.qk_norm ? "qwen3" : "llama";
  auto need = [&](bool ok, const std::string& knob) {
    if (!ok) cannot(arch, knob);
  };
  const RopeScaling::Kind k = c.rope_scaling.kind;
  if (arch == "gptneox") {
    need(!c.gated_mlp, "gated_mlp = true (its MLP is up, GELU, down)");
    need(c.activation == Activation::GeluErf || c.activation == Activation::GeluTanh, std::string("activation = ") + to_string(c.activation));
    need(c.kv_heads() == c.n_heads, "n_kv_heads = " + std::to_string(c.kv_heads()) + " (one fused qkv of n_heads heads each)");
    need(c.head_dim() * c.n_heads == c.d_model, "head_size = " + std::to_string(c.head_dim()));
    need(!c.qk_norm, "qk_norm = true");
    need(!c.has_sliding(), "layer_types with sliding layers");
    need(k == RopeScaling::Kind::None || k == RopeScaling::Kind::Linear, std::string("rope_scaling ") + to_string(k));
    return arch;
  }
  need(c.norm == (gemma ? NormKind::RMSNormPlusOne : NormKind::RMSNorm), std::string("norm = ") + to_string(c.norm));
  need(c.gated_mlp, "gated_mlp = false");
  need(c.activation == (gemma ? Activation::GeluTanh : Activation::Silu), std::string("activation = ") + to_string(c.activation));
  need(!c.parallel_residual, "parallel_residual = true");
  need(c.partial_rotary == 1.0, "partial_rotary = " + std::to_string(c.partial_rotary) + " (it rotates whole heads)");
  need(arch == "llama" || (!c.attn_bias && !c.mlp_bias), c.attn_bias ? "attn_bias = true" : "mlp_bias = true");
  if (gemma) {
    need(c.norm == NormKind::RMSNormPlusOne && c.sandwich_norms && c.embed_scale && c.tied_embeddings && !c.qk_norm,
         "a part of Gemma 2 without the rest (it has (1 + w) sandwich norms, a scaled embedding, a tied head and no QK-norm)");
    need(c.attn_softcap > 0, "attn_softcap = 0 (its graph always caps the scores)");
    need(c.final_softcap > 0, "final_softcap = 0 (its graph always caps the logits)");
    for (int64_t l = 0; l < c.n_layers; ++l)  // its default pattern: even layers slide, odd ones are full
      need(c.has_sliding() && (c.window(l) > 0) == (l % 2 == 0), "layer_types other than sliding, full, sliding, ...");
  } else {
    need(!c.sandwich_norms && !c.embed_scale && c.attn_softcap == 0 && c.final_softcap == 0 && c.query_pre_attn_scalar == 0,
         "a Gemma knob (sandwich_norms, embed_scale, a soft-cap or query_pre_attn_scalar)");
    // llama keeps a sliding window in its metadata, which its graph does not read (docs/engines.md).
    need(arch == "llama" || !c.has_sliding(), "layer_types with sliding layers");
  }
  need(k != RopeScaling::Kind::Llama3 || arch == "llama", "rope_scaling llama3 (its graph takes no rope_freqs)");
  if (k == RopeScaling::Kind::Yarn) {
    need(c.rope_scaling.truncate, "rope_scaling truncate = false");
    need(!c.rope_scaling.attention_factor || *c.rope_scaling.attention_factor == 0.1 * std::log(c.rope_scaling.factor) + 1,
         "rope_scaling attention_factor other than 0.1 ln(factor) + 1");
  }
  return arch;
}

void write_gguf(const std::string& path, GPT& model, const std::string& name) {
  const Config& c = model->config();
  const std::string arch = gguf_architecture(c);
  std::map<std::string, at::Tensor> sd;
  for (const auto& p : model->named_parameters()) sd[p.key()] = p.value().detach().to(at::kCPU).to(at::kFloat).contiguous();
  auto take = [&](const std::string& n) {
    const auto it = sd.find(n);
    if (it == sd.end()) throw std::logic_error("write_gguf: the model has no " + n);
    return it->second;
  };
  const int64_t H = c.n_heads, G = c.kv_heads(), hd = c.head_dim(), r = rope_spec(c).rotated();
  // llama's graph turns adjacent pairs (ggml's NORM RoPE), the others turn halves (NEOX).
  const bool want_adjacent = arch == "llama", have_adjacent = c.rope_pairing == RopePairing::Adjacent;
  auto pairing = [&](const at::Tensor& w, int64_t heads) {
    return want_adjacent == have_adjacent ? w : repair(w, heads, hd, r, want_adjacent);
  };
  const bool plus_one = c.norm == NormKind::RMSNormPlusOne;  // llama.cpp's Gemma norms read 1 + w from the file
  auto norm = [&](const std::string& n) { return plus_one ? take(n) + 1 : take(n); };
  std::vector<std::pair<std::string, at::Tensor>> t;  // in the order llama.cpp's loader lists them
  t.emplace_back("token_embd.weight", take("emb.weight"));
  t.emplace_back("output_norm.weight", norm("norm.weight"));
  if (arch == "gptneox") t.emplace_back("output_norm.bias", take("norm.bias"));
  if (!c.tied_embeddings) t.emplace_back("output.weight", take("head.weight"));
  else if (arch == "gptneox") t.emplace_back("output.weight", take("emb.weight"));  // gptneox has no tied fallback: a copy
  if (c.rope_scaling.kind == RopeScaling::Kind::Llama3) {
    // llama.cpp divides each frequency by its factor: ours unscaled over ours scaled, (r/2).
    RopeSpec plain = rope_spec(c);
    plain.scaling = RopeScaling{};
    t.emplace_back("rope_freqs.weight", rope_inv_frequencies(plain) / rope_inv_frequencies(rope_spec(c)));
  }
  // Gemma 2 at an unknown size scales q by head_dim^-0.5 (and 27B's by (d / H)^-0.5); ours by
  // query_pre_attn_scalar^-0.5: the difference goes into q's rows, before the soft-cap sees the scores.
  double q_gain = 1;
  if (arch == "gemma2" && c.query_pre_attn_scalar > 0) {
    const double theirs = c.n_layers == 46 ? static_cast<double>(c.d_model / H) : static_cast<double>(hd);
    q_gain = std::sqrt(theirs / c.query_pre_attn_scalar);
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".", o = "blocks." + std::to_string(l) + ".";
    if (arch == "gptneox") {  // one fused qkv: q | k | v, n_heads heads each
      const int64_t d = H * hd;
      auto qk_pairs = [&](const at::Tensor& w) {
        return at::cat({pairing(w.narrow(0, 0, d), H), pairing(w.narrow(0, d, d), H), w.narrow(0, 2 * d, d)});
      };
      t.emplace_back(p + "attn_norm.weight", take(o + "norm1.weight"));
      t.emplace_back(p + "attn_norm.bias", take(o + "norm1.bias"));
      t.emplace_back(p + "attn_qkv.weight", qk_pairs(take(o + "attn.qkv.weight")));
      t.emplace_back(p + "attn_qkv.bias", c.attn_bias ? qk_pairs(take(o + "attn.qkv.bias")) : at::zeros({3 * d}, at::kFloat));
      t.emplace_back(p + "attn_output.weight", take(o + "attn.out.weight"));
      t.emplace_back(p + "attn_output.bias", c.attn_bias ? take(o + "attn.out.bias") : at::zeros({c.d_model}, at::kFloat));
      t.emplace_back(p + "ffn_norm.weight", take(o + "norm2.weight"));
      t.emplace_back(p + "ffn_norm.bias", take(o + "norm2.bias"));
      for (const auto& [g, ours] : {std::pair{"ffn_up", "mlp.0"}, std::pair{"ffn_down", "mlp.2"}}) {
        t.emplace_back(p + g + ".weight", take(o + ours + ".weight"));
        t.emplace_back(p + g + ".bias", c.mlp_bias ? take(o + ours + ".bias") : at::zeros({take(o + ours + ".weight").size(0)}, at::kFloat));
      }
      continue;
    }
    t.emplace_back(p + "attn_norm.weight", norm(o + "norm1.weight"));
    const at::Tensor qkv = take(o + "attn.qkv.weight");  // ((H + 2G) hd, d): q | k | v
    t.emplace_back(p + "attn_q.weight", pairing(qkv.narrow(0, 0, H * hd), H) * q_gain);
    t.emplace_back(p + "attn_k.weight", pairing(qkv.narrow(0, H * hd, G * hd), G));
    t.emplace_back(p + "attn_v.weight", qkv.narrow(0, (H + G) * hd, G * hd).contiguous());
    if (c.attn_bias) {
      const at::Tensor b = take(o + "attn.qkv.bias");
      t.emplace_back(p + "attn_q.bias", pairing(b.narrow(0, 0, H * hd), H) * q_gain);
      t.emplace_back(p + "attn_k.bias", pairing(b.narrow(0, H * hd, G * hd), G));
      t.emplace_back(p + "attn_v.bias", b.narrow(0, (H + G) * hd, G * hd).contiguous());
    }
    t.emplace_back(p + "attn_output.weight", take(o + "attn.out.weight"));
    if (c.attn_bias) t.emplace_back(p + "attn_output.bias", take(o + "attn.out.bias"));
    if (c.qk_norm) {  // one (hd) weight per layer, its channels paired as q's and k's are
      t.emplace_back(p + "attn_q_norm.weight", pairing(take(o + "attn.q_norm.weight"), 1));
      t.emplace_back(p + "attn_k_norm.weight", pairing(take(o + "attn.k_norm.weight"), 1));
    }
    if (c.sandwich_norms) t.emplace_back(p + "post_attention_norm.weight", norm(o + "post_attn_norm.weight"));
    t.emplace_back(p + "ffn_norm.weight", norm(o + "norm2.weight"));
    for (const auto& [g, ours] : {std::pair{"ffn_gate", "gate"}, std::pair{"ffn_up", "up"}, std::pair{"ffn_down", "down"}}) {
      t.emplace_back(p + g + ".weight", take(o + "mlp." + ours + ".weight"));
      if (c.mlp_bias) t.emplace_back(p + g + ".bias", take(o + "mlp." + ours + ".bias"));
    }
    if (c.sandwich_norms) t.emplace_back(p + "post_ffw_norm.weight", norm(o + "post_mlp_norm.weight"));
  }
  auto u32 = [](std::string k, int64_t v) { return Kv{std::move(k), kU32, "", static_cast<uint64_t>(v), 0}; };
  auto f32 = [](std::string k, double v) { return Kv{std::move(k), kF32, "", 0, static_cast<float>(v)}; };
  const std::string a = arch + ".";
  std::vector<Kv> kv = {
      {"general.architecture", kString, arch},
      {"general.name", kString, name},
      u32("general.file_type", 0),  // all F32
      u32("general.alignment", kAlignment),
      u32(a + "context_length", c.context),
      u32(a + "embedding_length", c.d_model),
      u32(a + "block_count", c.n_layers),
      u32(a + "feed_forward_length", c.ffn_dim()),
      u32(a + "rope.dimension_count", r),
      f32(a + "rope.freq_base", c.rope_theta),
      u32(a + "attention.head_count", H),
  };
  if (arch == "gptneox") {
    kv.push_back({a + "use_parallel_residual", kBool, "", c.parallel_residual ? 1u : 0u, 0});
    kv.push_back(f32(a + "attention.layer_norm_epsilon", c.norm_eps));
  } else {
    kv.push_back(u32(a + "attention.head_count_kv", G));
    kv.push_back(u32(a + "attention.key_length", hd));
    kv.push_back(u32(a + "attention.value_length", hd));
    kv.push_back(f32(a + "attention.layer_norm_rms_epsilon", c.norm_eps));
    if (c.has_sliding()) kv.push_back(u32(a + "attention.sliding_window", c.sliding_window));
    if (c.attn_softcap > 0) kv.push_back(f32(a + "attn_logit_softcapping", c.attn_softcap));
    if (c.final_softcap > 0) kv.push_back(f32(a + "final_logit_softcapping", c.final_softcap));
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.kind == RopeScaling::Kind::Linear) {
    kv.push_back({a + "rope.scaling.type", kString, "linear"});
    kv.push_back(f32(a + "rope.scaling.factor", s.factor));
  } else if (s.kind == RopeScaling::Kind::Yarn) {
    kv.push_back({a + "rope.scaling.type", kString, "yarn"});
    kv.push_back(f32(a + "rope.scaling.factor", s.factor));
    kv.push_back(u32(a + "rope.scaling.original_context_length", s.original_context));
    kv.push_back(f32(a + "rope.scaling.yarn_beta_fast", s.beta_fast));
    kv.push_back(f32(a + "rope.scaling.yarn_beta_slow", s.beta_slow));
  }
  kv.push_back(u32(a + "vocab_size", c.vocab_size));
  kv.push_back({"tokenizer.ggml.model", kString, "none"});  // ids pass straight through
  write_file(path, kv, t);
}

GgufFile read_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open");
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string data = buf.str();
  size_t pos = 0;
  auto fail = [&](const std::string& why) -> void { throw InputError(path + ": not a GGUF file we can read (" + why + ")"); };
  auto take = [&](void* dst, size_t n) {
    if (n > data.size() - pos) fail("truncated at byte " + std::to_string(pos));
    std::memcpy(dst, data.data() + pos, n);
    pos += n;
  };
  auto u32 = [&] { uint32_t v; take(&v, 4); return v; };
  auto u64 = [&] { uint64_t v; take(&v, 8); return v; };
  auto str = [&] {
    const uint64_t n = u64();
    if (n > data.size() - pos) fail("a string runs past the end");
    std::string s(data.data() + pos, n);
    pos += n;
    return s;
  };
  GgufFile f;
  if (u32() != kMagic) fail("no GGUF magic");
  f.version = u32();
  if (f.version != kVersion) fail("version " + std::to_string(f.version));
  const uint64_t n_tensors = u64(), n_kv = u64();
  if (n_tensors > 100000 || n_kv > 100000) fail("absurd counts");
  uint64_t alignment = kAlignment;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = str();
    const uint32_t type = u32();
    std::string value;
    switch (type) {
      case kString: value = str(); break;
      case kU32: value = std::to_string(u32()); break;
      case kI32: value = std::to_string(static_cast<int32_t>(u32())); break;
      case kF32: { float v; take(&v, 4); std::ostringstream s; s << v; value = s.str(); } break;
      case kBool: { uint8_t v; take(&v, 1); value = v ? "true" : "false"; } break;
      case kU64: value = std::to_string(u64()); break;
      default: fail("metadata type " + std::to_string(type) + " of " + key);
    }
    if (key == "general.alignment") {
      if (type != kU32 && type != kU64) fail("general.alignment is not an unsigned integer");
      alignment = std::stoull(value);
      if (alignment == 0 || alignment > (1u << 20) || (alignment & (alignment - 1)) != 0)
        fail("general.alignment " + value + " is not a power of two up to 1 MiB");
    }
    f.metadata[key] = value;
  }
  struct Info {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t offset;
  };
  std::vector<Info> infos;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Info t;
    t.name = str();
    const uint32_t dims = u32();
    if (dims < 1 || dims > 4) fail(t.name + " has " + std::to_string(dims) + " dimensions");
    std::vector<int64_t> ne(dims);
    for (auto& e : ne) {
      const uint64_t d = u64();
      if (d > data.size()) fail(t.name + " has a dimension of " + std::to_string(d) + ", more than the file's bytes");
      e = static_cast<int64_t>(d);
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    if (u32() != kGgmlF32) fail(t.name + " is not F32");
    t.offset = u64();
    infos.push_back(std::move(t));
  }
  const uint64_t start = (pos + alignment - 1) / alignment * alignment;
  for (const auto& t : infos) {
    uint64_t n = 1;  // each dimension is at most the file's size, so the product is checked step by step
    for (int64_t e : t.shape) {
      n *= static_cast<uint64_t>(e);
      if (n > data.size()) fail(t.name + "'s data runs past the end");
    }
    if (start > data.size() || t.offset > data.size() - start || n * 4 > data.size() - start - t.offset)
      fail(t.name + "'s data runs past the end");
    at::Tensor x = at::empty(t.shape, at::kFloat);
    if (n) std::memcpy(x.data_ptr<float>(), data.data() + start + t.offset, static_cast<size_t>(n) * 4);
    f.tensors.emplace_back(t.name, x);
  }
  return f;
}

}  // namespace tinygpt
