// Writes the series' checkpoint format with LibTorch's zip writer and a hand-emitted pickle that
// uses exactly the opcodes torch.save emits for these files (SPEC 8), so Python's torch.load and
// our restricted unpickler both read it.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <map>

#include "tinygpt/atomic_file.h"
#include "tinygpt/torch_checkpoint.h"

namespace tinygpt {

namespace {

class Pickle {
 public:
  void op(uint8_t o) { s_.push_back(static_cast<char>(o)); }
  void str(const std::string& v) {
    op('X');
    le(v.size(), 4);
    s_ += v;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      op(0x8a);  // LONG1, 8 bytes two's complement
      op(8);
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void real(double v) {
    op('G');
    uint64_t u;
    std::memcpy(&u, &v, 8);
    for (int i = 7; i >= 0; --i) s_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void global(const std::string& mod, const std::string& name) {
    op('c');
    s_ += mod + "\n" + name + "\n";
  }
  void ordered_dict() {
    global("collections", "OrderedDict");
    op(')');
    op('R');
  }
  const std::string& bytes() const { return s_; }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string s_;
};

}  // namespace

void write_torch_checkpoint(const std::string& path, const Checkpoint& ck) {
  ck.config.require_seed_architecture("the series' .pt format");  // its config dict has no place for a knob
  Pickle p;
  p.op(0x80);
  p.op(2);
  p.op('}');
  p.op('(');
  p.str("model");
  p.ordered_dict();
  p.op('(');
  std::map<const void*, std::string> keys;  // storage -> record key (the tied head shares emb's)
  std::vector<std::pair<std::string, at::Tensor>> records;
  for (const auto& [name, t] : ck.tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    if (c.scalar_type() != at::kFloat && c.scalar_type() != at::kHalf && c.scalar_type() != at::kBFloat16)
      throw std::runtime_error(path + ": " + name + ": only float32/float16/bfloat16 tensors can be written");
    // A tied weight is the same tensor memory: write one storage, reference it twice.
    const void* storage = t.data_ptr();
    std::string key;
    if (auto it = keys.find(storage);
        it != keys.end() && t.is_contiguous() && t.numel() == records[std::stoul(it->second)].second.numel()) {
      key = it->second;
    } else {
      key = std::to_string(records.size());
      keys[storage] = key;
      records.emplace_back(key, c);
    }
    const char* storage_type = c.scalar_type() == at::kFloat ? "FloatStorage"
                               : c.scalar_type() == at::kHalf ? "HalfStorage" : "BFloat16Storage";
    p.str(name);
    p.global("torch._utils", "_rebuild_tensor_v2");
    p.op('(');
    p.op('(');  // persistent id
    p.str("storage");
    p.global("torch", storage_type);
    p.str(key);
    p.str("cpu");
    p.integer(c.numel());
    p.op('t');
    p.op('Q');
    p.integer(0);
    p.op('(');
    for (int64_t d : c.sizes()) p.integer(d);
    p.op('t');
    p.op('(');
    for (int64_t s : c.strides()) p.integer(s);
    p.op('t');
    p.op(0x89);  // requires_grad False
    p.ordered_dict();  // backward hooks
    p.op('t');
    p.op('R');
  }
  p.op('u');
  p.str("config");
  p.op('}');
  p.op('(');
  for (const auto& [k, v] : std::vector<std::pair<std::string, int64_t>>{
           {"vocab_size", ck.config.vocab_size}, {"d_model", ck.config.d_model}, {"n_heads", ck.config.n_heads},
           {"n_layers", ck.config.n_layers}, {"context", ck.config.context}}) {
    p.str(k);
    p.integer(v);
  }
  p.str("dropout");
  p.real(ck.config.dropout);
  p.op('u');
  p.str("step");
  p.integer(ck.step);
  p.op('u');
  p.op('.');

  write_atomically_via(path, [&](const std::string& tmp) {
    try {
      caffe2::serialize::PyTorchStreamWriter writer(tmp);
      writer.writeRecord("data.pkl", p.bytes().data(), p.bytes().size());
      for (const auto& [key, c] : records) writer.writeRecord("data/" + key, c.data_ptr(), c.numel() * c.element_size());
      writer.writeEndOfFile();
    } catch (const c10::Error& e) {
      std::string msg = e.what();
      if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
      throw std::runtime_error(path + ": cannot write checkpoint (" + msg + ")");
    }
  });
}

}  // namespace tinygpt
