// Reads the series' .pt checkpoints: PyTorch's zip with LibTorch's own reader, the pickle with a
// restricted unpickler that accepts only what torch.save emits for these files (torch_checkpoint.h).
#include "tinygpt/torch_checkpoint.h"

#include "tinygpt/errors.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace tinygpt {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InputError(path + ": " + what);
}

// A pickle value, restricted to what torch.save writes for a state-dict checkpoint.
struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Value {
  enum Kind { None, Bool, Int, Float, String, Tuple, Dict, Global, Storage, Tensor, Mark } kind = None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                   // String; Global "module.name"
  std::vector<ValuePtr> items;                     // Tuple
  std::vector<std::pair<ValuePtr, ValuePtr>> dict; // Dict, insertion order
  at::Tensor t;                                    // Storage (1-D) or Tensor
  at::ScalarType dtype = at::kFloat;               // Global storage type
};

ValuePtr make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

// The globals torch.save emits for these files; anything else is refused by name.
bool storage_dtype(const std::string& g, at::ScalarType* out) {
  if (g == "torch.FloatStorage") *out = at::kFloat;
  else if (g == "torch.HalfStorage") *out = at::kHalf;
  else if (g == "torch.BFloat16Storage") *out = at::kBFloat16;
  else return false;
  return true;
}

class Unpickler {
 public:
  Unpickler(const std::string& path, caffe2::serialize::PyTorchStreamReader& zip, const uint8_t* data, size_t n)
      : path_(path), zip_(zip), p_(data), end_(data + n) {}

  ValuePtr run() {
    while (true) {
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;  // PROTO
        case '}': push(make(Value::Dict)); break;
        case ')': push(make(Value::Tuple)); break;
        case '(': push(make(Value::Mark)); break;
        case 'N': push(make(Value::None)); break;
        case 0x88: case 0x89: { auto v = make(Value::Bool); v->b = op == 0x88; push(v); break; }
        case 'K': push_int(byte()); break;
        case 'M': push_int(le(2)); break;
        case 'J': push_int(static_cast<int32_t>(le(4))); break;
        case 0x8a: {  // LONG1: little-endian two's complement, up to 8 bytes
          const size_t n = byte();
          if (n > 8) bad("LONG1 longer than 8 bytes");
          uint64_t u = le(n);
          if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~uint64_t(0) << (8 * n);
          push_int(static_cast<int64_t>(u));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian double
          uint64_t u = 0;
          for (int k = 0; k < 8; ++k) u = (u << 8) | byte();
          auto v = make(Value::Float);
          std::memcpy(&v->f, &u, 8);
          push(v);
          break;
        }
        case 'X': push_str(le(4)); break;      // BINUNICODE
        case 0x8c: push_str(byte()); break;    // SHORT_BINUNICODE
        case 'c': {                            // GLOBAL "module\nname\n"
          const std::string mod = line(), name = line();
          const std::string g = mod + "." + name;
          auto v = make(Value::Global);
          v->s = g;
          if (g != "collections.OrderedDict" && g != "torch._utils._rebuild_tensor_v2" &&
              !storage_dtype(g, &v->dtype)) {
            if (mod == "torch" && name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0)
              bad("tensor dtype " + name + " is not supported (float32, float16 and bfloat16 are)");
            bad("refused global '" + g + "': a checkpoint may only name collections.OrderedDict, "
                "torch._utils._rebuild_tensor_v2 and torch float storages");
          }
          push(v);
          break;
        }
        case 'q': memo(byte()); break;             // BINPUT
        case 'r': memo(le(4)); break;              // LONG_BINPUT
        case 'h': push(get_memo(byte())); break;   // BINGET
        case 'j': push(get_memo(le(4))); break;    // LONG_BINGET
        case 't': { auto v = make(Value::Tuple); v->items = pop_to_mark(); push(v); break; }
        case 0x85: case 0x86: case 0x87: {
          const size_t n = op - 0x84;
          auto v = make(Value::Tuple);
          v->items.resize(n);
          for (size_t k = n; k-- > 0;) v->items[k] = pop();
          push(v);
          break;
        }
        case 's': { auto val = pop(), key = pop(); dict_top()->dict.emplace_back(key, val); break; }
        case 'u': {
          auto items = pop_to_mark();
          if (items.size() % 2) bad("SETITEMS with an odd number of items");
          auto d = dict_top();
          for (size_t k = 0; k < items.size(); k += 2) d->dict.emplace_back(items[k], items[k + 1]);
          break;
        }
        case 'Q': push(persistent(pop())); break;  // BINPERSID
        case 'R': { auto args = pop(), fn = pop(); push(reduce(fn, args)); break; }
        case 'b': {  // BUILD: only the OrderedDict's _metadata attribute, which is ignored
          pop();
          if (stack_.empty() || stack_.back()->kind != Value::Dict) bad("BUILD on something other than a dict");
          break;
        }
        case '.': if (stack_.size() != 1) bad("STOP with a malformed stack"); return stack_.back();
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          bad(std::string("refused pickle opcode ") + hex + " (not used by torch.save for checkpoints)");
        }
      }
    }
  }

 private:
  [[noreturn]] void bad(const std::string& what) { fail(path_, what); }
  uint8_t byte() {
    if (p_ >= end_) bad("pickle ends early");
    return *p_++;
  }
  uint64_t le(size_t n) {
    uint64_t u = 0;
    for (size_t k = 0; k < n; ++k) u |= uint64_t(byte()) << (8 * k);
    return u;
  }
  std::string line() {
    std::string s;
    for (uint8_t c; (c = byte()) != '\n';) s += static_cast<char>(c);
    return s;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  void push_int(int64_t i) { auto v = make(Value::Int); v->i = i; push(v); }
  void push_str(uint64_t n) {
    if (n > static_cast<uint64_t>(end_ - p_)) bad("string runs past the end of the pickle");
    auto v = make(Value::String);
    v->s.assign(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    push(v);
  }
  ValuePtr pop() {
    if (stack_.empty() || stack_.back()->kind == Value::Mark) bad("pickle stack underflow");
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<ValuePtr> pop_to_mark() {
    std::vector<ValuePtr> items;
    while (true) {
      if (stack_.empty()) bad("MARK missing");
      auto v = stack_.back();
      stack_.pop_back();
      if (v->kind == Value::Mark) break;
      items.push_back(v);
    }
    return {items.rbegin(), items.rend()};
  }
  ValuePtr dict_top() {
    if (stack_.empty() || stack_.back()->kind != Value::Dict) bad("SETITEM on something other than a dict");
    return stack_.back();
  }
  void memo(uint64_t k) {
    if (stack_.empty()) bad("PUT on an empty stack");
    memo_[k] = stack_.back();
  }
  ValuePtr get_memo(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) bad("GET of an unknown memo key");
    return it->second;
  }

  // ('storage', <storage global>, key, location, numel) -> the 1-D storage tensor of record data/<key>.
  ValuePtr persistent(const ValuePtr& pid) {
    if (pid->kind != Value::Tuple || pid->items.size() != 5 || pid->items[0]->s != "storage" ||
        pid->items[1]->kind != Value::Global || pid->items[2]->kind != Value::String || pid->items[4]->kind != Value::Int)
      bad("malformed persistent id (expected ('storage', type, key, location, numel))");
    at::ScalarType dtype;
    if (!storage_dtype(pid->items[1]->s, &dtype)) bad("persistent id names " + pid->items[1]->s);
    const std::string key = pid->items[2]->s;
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;  // a tied weight: same storage, same tensor
    const int64_t numel = pid->items[4]->i;
    const std::string record = "data/" + key;
    if (!zip_.hasRecord(record)) bad("missing record " + record);
    auto [ptr, size] = zip_.getRecord(record);
    const size_t want = static_cast<size_t>(numel) * c10::elementSize(dtype);
    if (numel < 0 || size != want)
      bad("record " + record + " holds " + std::to_string(size) + " bytes, its storage needs " + std::to_string(want));
    auto v = make(Value::Storage);
    v->t = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (size) std::memcpy(v->t.data_ptr(), ptr.get(), size);
    storages_[key] = v;
    return v;
  }

  static std::vector<int64_t> ints(const ValuePtr& tup, const char* what, Unpickler* self) {
    if (tup->kind != Value::Tuple) self->bad(std::string("tensor ") + what + " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& x : tup->items) {
      if (x->kind != Value::Int) self->bad(std::string("tensor ") + what + " holds a non-integer");
      out.push_back(x->i);
    }
    return out;
  }

  ValuePtr reduce(const ValuePtr& fn, const ValuePtr& args) {
    if (fn->kind != Value::Global || args->kind != Value::Tuple) bad("REDUCE of something other than an allowed global");
    if (fn->s == "collections.OrderedDict") {
      if (!args->items.empty()) bad("OrderedDict called with arguments");
      return make(Value::Dict);
    }
    if (fn->s == "torch._utils._rebuild_tensor_v2") {
      const auto& a = args->items;
      if (a.size() < 4 || a[0]->kind != Value::Storage || a[1]->kind != Value::Int)
        bad("malformed _rebuild_tensor_v2 arguments");
      const auto size = ints(a[2], "size", this), stride = ints(a[3], "stride", this);
      if (size.size() != stride.size()) bad("tensor size and stride differ in rank");
      const int64_t offset = a[1]->i, n = a[0]->t.numel();
      int64_t last = offset;
      bool empty = false;
      for (size_t k = 0; k < size.size(); ++k) {
        if (size[k] < 0 || stride[k] < 0) bad("negative tensor size or stride");
        if (size[k] == 0) empty = true;
        last += (size[k] - 1) * stride[k];
      }
      if (offset < 0 || (!empty && last >= n)) bad("tensor view runs past its storage");
      auto v = make(Value::Tensor);
      v->t = a[0]->t.as_strided(size, stride, offset);
      return v;
    }
    bad("REDUCE of " + fn->s + " is not allowed");
  }

  std::string path_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  const uint8_t* p_;
  const uint8_t* end_;
  std::vector<ValuePtr> stack_;
  std::map<uint64_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
};

const Value* lookup(const Value& dict, const std::string& key) {
  for (const auto& [k, v] : dict.dict)
    if (k->kind == Value::String && k->s == key) return v.get();
  return nullptr;
}

}  // namespace

Checkpoint read_torch_checkpoint(const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    fail(path, "not a PyTorch zip checkpoint (" + msg + ")");
  }
  if (!zip->hasRecord("data.pkl")) fail(path, "no data.pkl record: not a torch.save file");
  auto [pkl, size] = zip->getRecord("data.pkl");
  Unpickler up(path, *zip, static_cast<const uint8_t*>(pkl.get()), size);
  ValuePtr root = up.run();
  if (root->kind != Value::Dict) fail(path, "top level is not a dict {model, config, step}");
  const Value* model = lookup(*root, "model");
  const Value* cfg = lookup(*root, "config");
  const Value* step = lookup(*root, "step");
  if (!model || model->kind != Value::Dict) fail(path, "no 'model' state dict");
  if (!cfg || cfg->kind != Value::Dict) fail(path, "no 'config' dict");
  Checkpoint ck;
  if (step && step->kind == Value::Int) ck.step = step->i;
  auto int_field = [&](const char* name, int64_t* out) {
    const Value* v = lookup(*cfg, name);
    if (!v || v->kind != Value::Int) fail(path, std::string("config.") + name + " missing or not an integer");
    *out = v->i;
  };
  int_field("vocab_size", &ck.config.vocab_size);
  int_field("d_model", &ck.config.d_model);
  int_field("n_heads", &ck.config.n_heads);
  int_field("n_layers", &ck.config.n_layers);
  int_field("context", &ck.config.context);
  if (const Value* d = lookup(*cfg, "dropout"))
    ck.config.dropout = d->kind == Value::Float ? d->f : static_cast<double>(d->i);
  try {
    ck.config.validate();
  } catch (const std::exception& e) {
    fail(path, e.what());
  }
  for (const auto& [k, v] : model->dict) {
    if (k->kind != Value::String || v->kind != Value::Tensor) fail(path, "state dict entry is not name -> tensor");
    ck.tensors.emplace_back(k->s, v->t);
  }
  return ck;
}

}  // namespace tinygpt
