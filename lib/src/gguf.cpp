#include "tinygpt/gguf.h"

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tinygpt/atomic_file.h"
#include "tinygpt/errors.h"

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

}  // namespace

at::Tensor permute_qk_rows(const at::Tensor& qkv, int64_t n_heads, bool inverse) {
  const int64_t d3 = qkv.size(0), d = d3 / 3, hd = d / n_heads;
  if (d3 % 3 != 0 || d % n_heads != 0 || hd % 2 != 0) throw std::invalid_argument("permute_qk_rows: not a (3d, ...) qkv with even heads");
  std::vector<int64_t> src(static_cast<size_t>(d3));
  for (int64_t r = 0; r < d3; ++r) src[r] = r;  // v rows stay
  for (int64_t part = 0; part < 2; ++part)       // q, then k
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t j = 0; j < hd / 2; ++j) {
        const int64_t base = part * d + h * hd;
        src[base + j] = base + 2 * j;
        src[base + hd / 2 + j] = base + 2 * j + 1;
      }
  std::vector<int64_t> idx = src;
  if (inverse)
    for (int64_t r = 0; r < d3; ++r) idx[src[r]] = r;
  return qkv.index_select(0, at::tensor(idx, at::kLong).to(qkv.device()));
}

void write_gguf(const std::string& path, GPT& model, const std::string& name) {
  const Config& c = model->config();
  c.require_seed_architecture("GGUF export (the gptneox graph of the seed's model)");
  std::vector<std::pair<std::string, at::Tensor>> t;  // in the order llama.cpp's loader lists them
  auto f32 = [](const at::Tensor& x) { return x.detach().to(at::kCPU).to(at::kFloat).contiguous(); };
  t.emplace_back("token_embd.weight", f32(model->emb->weight));
  t.emplace_back("output_norm.weight", f32(model->norm->weight));
  t.emplace_back("output_norm.bias", f32(model->norm->bias));
  t.emplace_back("output.weight", f32(model->emb->weight));  // the tied head, copied
  int64_t i = 0;
  for (const auto& m : *model->blocks) {
    const auto* b = m->as<BlockImpl>();
    const std::string p = "blk." + std::to_string(i++) + ".";
    t.emplace_back(p + "attn_norm.weight", f32(b->norm1->weight));
    t.emplace_back(p + "attn_norm.bias", f32(b->norm1->bias));
    t.emplace_back(p + "attn_qkv.weight", permute_qk_rows(f32(b->attn->qkv->weight), c.n_heads));
    t.emplace_back(p + "attn_qkv.bias", at::zeros({3 * c.d_model}, at::kFloat));
    t.emplace_back(p + "attn_output.weight", f32(b->attn->out->weight));
    t.emplace_back(p + "attn_output.bias", at::zeros({c.d_model}, at::kFloat));
    t.emplace_back(p + "ffn_norm.weight", f32(b->norm2->weight));
    t.emplace_back(p + "ffn_norm.bias", f32(b->norm2->bias));
    t.emplace_back(p + "ffn_up.weight", f32(b->up->weight));
    t.emplace_back(p + "ffn_up.bias", f32(b->up->bias));
    t.emplace_back(p + "ffn_down.weight", f32(b->down->weight));
    t.emplace_back(p + "ffn_down.bias", f32(b->down->bias));
  }
  auto u32 = [](std::string k, uint64_t v) { return Kv{std::move(k), kU32, "", v, 0}; };
  const std::vector<Kv> kv = {
      {"general.architecture", kString, "gptneox"},
      {"general.name", kString, name},
      u32("general.file_type", 0),  // all F32
      u32("general.alignment", kAlignment),
      u32("gptneox.context_length", static_cast<uint64_t>(c.context)),
      u32("gptneox.embedding_length", static_cast<uint64_t>(c.d_model)),
      u32("gptneox.block_count", static_cast<uint64_t>(c.n_layers)),
      u32("gptneox.feed_forward_length", static_cast<uint64_t>(4 * c.d_model)),
      u32("gptneox.rope.dimension_count", static_cast<uint64_t>(c.head_dim())),
      {"gptneox.rope.freq_base", kF32, "", 0, 10000.0f},
      u32("gptneox.attention.head_count", static_cast<uint64_t>(c.n_heads)),
      {"gptneox.use_parallel_residual", kBool, "", 0, 0},
      {"gptneox.attention.layer_norm_epsilon", kF32, "", 0, 1e-5f},
      u32("gptneox.vocab_size", static_cast<uint64_t>(c.vocab_size)),
      {"tokenizer.ggml.model", kString, "none"},  // ids pass straight through
  };
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
