#include "tinygpt/safetensors.h"
#include "tinygpt/errors.h"

#include "tinygpt/atomic_file.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tinygpt {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InputError(path + ": " + what);
}

const std::map<std::string, at::ScalarType>& dtypes() {
  static const std::map<std::string, at::ScalarType> m = {
      {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"F64", at::kDouble},
      {"I64", at::kLong},  {"I32", at::kInt},  {"I8", at::kChar},       {"U8", at::kByte}, {"BOOL", at::kBool}};
  return m;
}

std::string dtype_name(at::ScalarType t, const std::string& path) {
  for (const auto& [n, s] : dtypes())
    if (s == t) return n;
  fail(path, std::string("cannot write dtype ") + c10::toString(t));
}

}  // namespace

TensorFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8) fail(path, "too short for a safetensors header");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n == 0 || n > file_size - 8 || n > (100u << 20)) fail(path, "not a safetensors file (header length " + std::to_string(n) + " out of bounds) nor a PyTorch zip");
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    fail(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail(path, "header is not a JSON object");
  const uint64_t buffer = file_size - 8 - n;
  TensorFile tf;
  struct Entry { std::string name; at::ScalarType dtype; std::vector<int64_t> shape; uint64_t begin, end; };
  std::vector<Entry> entries;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(path, "__metadata__." + k + " is not a string");
        tf.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      fail(path, name + ": entry needs dtype, shape and data_offsets");
    const auto dt = v["dtype"].is_string() ? dtypes().find(v["dtype"].get<std::string>()) : dtypes().end();
    if (dt == dtypes().end()) fail(path, name + ": unsupported dtype " + v["dtype"].dump());
    Entry e{name, dt->second, {}, 0, 0};
    if (!v["shape"].is_array()) fail(path, name + ": shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) fail(path, name + ": shape holds a non-negative integer only");
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(path, name + ": data_offsets must be [begin, end]");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > buffer)
      fail(path, name + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                     "] outside the " + std::to_string(buffer) + "-byte buffer");
    if (e.end - e.begin != numel * c10::elementSize(e.dtype))
      fail(path, name + ": " + std::to_string(e.end - e.begin) + " bytes for " + v["dtype"].get<std::string>() +
                     " shape " + v["shape"].dump() + " (needs " + std::to_string(numel * c10::elementSize(e.dtype)) + ")");
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t expect = 0;
  for (const auto& e : entries) {
    if (e.begin < expect) fail(path, e.name + ": its bytes overlap the previous tensor's");
    if (e.begin > expect) fail(path, e.name + ": a hole of " + std::to_string(e.begin - expect) + " bytes before it");
    expect = e.end;
  }
  if (expect != buffer) fail(path, std::to_string(buffer - expect) + " trailing bytes after the last tensor");
  for (const auto& e : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    in.seekg(static_cast<std::streamoff>(8 + n + e.begin));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) fail(path, e.name + ": read failed");
    tf.tensors.emplace_back(e.name, t);
  }
  return tf;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (j.contains(name)) fail(path, "duplicate tensor name " + name);
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = c.numel() * c.element_size();
    j[name] = {{"dtype", dtype_name(c.scalar_type(), path)}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(c);
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // align the buffer to 8 bytes
  write_atomically(path, [&](std::ostream& out) {
    uint64_t n = header.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& c : data) out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
  });
}

Checkpoint read_safetensors_checkpoint(const std::string& path) {
  TensorFile tf = read_safetensors(path);
  auto it = tf.metadata.find("config");
  if (it == tf.metadata.end()) fail(path, "no config in __metadata__ (not a tinygpt checkpoint)");
  Checkpoint ck;
  try {
    ck.config = config_from_json(it->second);  // validates; an unknown knob is refused by name
  } catch (const std::exception& e) {
    fail(path, std::string("config metadata: ") + e.what());
  }
  if (auto s = tf.metadata.find("step"); s != tf.metadata.end()) ck.step = std::stoll(s->second);
  for (const auto& [k, v] : tf.metadata)
    if (k != "config" && k != "step" && k != "tied") ck.metadata[k] = v;
  ck.tensors = std::move(tf.tensors);
  const bool has_head = std::any_of(ck.tensors.begin(), ck.tensors.end(), [](const auto& p) { return p.first == "head.weight"; });
  if (!has_head && ck.config.tied_embeddings) {
    for (const auto& [name, t] : ck.tensors)
      if (name == "emb.weight") {
        ck.tensors.emplace_back("head.weight", t);  // the tied head
        break;
      }
  }
  return ck;
}

void write_safetensors_checkpoint(const std::string& path, const Checkpoint& ck,
                                  std::map<std::string, std::string> extra) {
  std::map<std::string, std::string> metadata = ck.metadata;
  for (const auto& [k, v] : extra) metadata[k] = v;
  metadata["config"] = config_to_json(ck.config);  // the seed's six fields, then any knob (SPEC 10)
  metadata["step"] = std::to_string(ck.step);
  const bool tied = ck.config.tied_embeddings;
  if (tied) metadata["tied"] = "head.weight=emb.weight";
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : ck.tensors)
    if (!tied || p.first != "head.weight") tensors.push_back(p);
  write_safetensors(path, tensors, metadata);
}

}  // namespace tinygpt
