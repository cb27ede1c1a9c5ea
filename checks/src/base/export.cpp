#include "tinygpt/torch_checkpoint.h"
#include "tinygpt/checks/export.h"

#include <stdlib.h>
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "tinygpt/checks/data.h"
#include "tinygpt/gguf.h"
#include "tinygpt/hf_checkpoint.h"
#include "tinygpt/rope_scaling.h"
#include "tinygpt/safetensors.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::checks {

namespace fs = std::filesystem;

namespace {

// A shell word: single-quoted, with embedded quotes escaped.
std::string shell_quoted(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int run(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

}  // namespace

const std::vector<std::string>& gguf_weight_types() {
  static const std::vector<std::string> t = {"q8_0", "q4_0", "q4_K_M"};
  return t;
}

int64_t gguf_block_size(const std::string& weight_type) {
  if (weight_type == "q8_0" || weight_type == "q4_0") return 32;
  if (weight_type == "q4_K_M") return 256;
  throw std::invalid_argument("unknown weight type '" + weight_type + "' (q8_0, q4_0, q4_K_M)");
}

void check_quantizable(GPT& model, const std::string& weight_type) {
  const int64_t block = gguf_block_size(weight_type);
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& w = item.value();
    if (w.dim() == 2 && w.size(1) % block != 0)
      throw std::invalid_argument(weight_type + ": " + item.key() + " has rows of " + std::to_string(w.size(1)) + " values, which " +
                                  weight_type + "'s blocks of " + std::to_string(block) +
                                  " cannot divide (llama-quantize would store it as another type)");
  }
}

void export_quantized_gguf(GPT& model, const std::string& weight_type, const std::string& quantizer, const std::string& out) {
  check_quantizable(model, weight_type);
  if (quantizer.empty()) throw std::invalid_argument("a quantized GGUF needs a quantizer command (llama-quantize, or the llama.cpp adapter's --quantize)");
  const std::string f32 = out + ".f32.tmp", part = out + ".part.tmp";
  struct Cleanup {
    std::vector<std::string> paths;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& p : paths) fs::remove(p, ec);
    }
  } cleanup{{f32, part}};
  write_gguf(f32, model);
  const int rc = run(quantizer + " " + shell_quoted(f32) + " " + shell_quoted(part) + " " + shell_quoted(weight_type) + " >&2");
  if (rc != 0 || !fs::exists(part))
    throw std::runtime_error("the quantizer (" + quantizer + ") exited " + std::to_string(rc) + " quantizing to " + weight_type +
                             (rc == 0 ? " and wrote nothing" : ""));
  fs::rename(part, out);
}

const std::vector<std::string>& export_formats() {
  static const std::vector<std::string> f = {"pt", "safetensors", "gguf", "onnx", "hf", "transformers-js"};
  return f;
}

void export_model(const Checkpoint& ck, GPT& model, const std::string& format, const std::string& out, const std::string& tokenizer) {
  if (format == "pt") return write_torch_checkpoint(out, ck);
  if (format == "safetensors") return write_safetensors_checkpoint(out, ck);
  if (format == "gguf") return write_gguf(out, model);
  if (format == "hf") {
    // The given tokenizer (no more ids than the model has), else the shipped one where it fits exactly.
    std::string json;
    const bool given = !tokenizer.empty();
    const std::string path = given ? tokenizer : data_dir() + "/tokenizer.json";
    if (given || fs::exists(path)) {
      const Tokenizer tok = Tokenizer::load(path);
      if (given && tok.vocab_size() > ck.config.vocab_size)
        throw std::invalid_argument(tokenizer + ": " + std::to_string(tok.vocab_size()) + " ids, more than the model's " +
                                    std::to_string(ck.config.vocab_size));
      if (given || tok.vocab_size() == ck.config.vocab_size)
        json = tok.hf() ? read_text(fs::is_directory(path) ? path + "/tokenizer.json" : path) : tok.to_hf_json();
    }
    return write_hf_checkpoint(out, ck, json);
  }
  if (format != "onnx" && format != "transformers-js")
    throw std::invalid_argument("unknown export format '" + format + "' (pt, safetensors, gguf, onnx, hf, transformers-js)");
  // Debian's python3-torch lives with /usr/bin/python3; TINYGPT_PYTHON names another interpreter.
  const char* env = std::getenv("TINYGPT_PYTHON");
  const std::string python = env && *env ? env : (fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3");
  if (run(shell_quoted(python) + " -c 'import torch' >/dev/null 2>&1") != 0)
    throw std::runtime_error("export --format " + format + " needs PyTorch for Python (Debian: apt-get install python3-torch); " + python +
                             " cannot import torch (TINYGPT_PYTHON names another interpreter)");
  const std::string script = engines_dir() + "/onnxruntime/export_onnx.py";
  std::string tmpl = (fs::temp_directory_path() / "tinygpt-export-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("export: cannot create a temporary folder");
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{tmpl};
  std::string in = tmpl + "/model.pt";
  if (ck.config.is_seed_architecture()) {
    write_torch_checkpoint(in, ck);
  } else {
    // A zoo member has no .pt form: our .safetensors, with the RoPE the graph turns by (SPEC 10's
    // frequencies and attention factor, as this library computes them) in its metadata.
    in = tmpl + "/model.safetensors";
    const RopeSpec spec = rope_spec(ck.config);
    const at::Tensor f = rope_inv_frequencies(spec).contiguous();
    const std::vector<float> freqs(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
    write_safetensors_checkpoint(in, ck, {{"rope_inv_freq", nlohmann::json(freqs).dump()},
                                          {"rope_attention_factor", nlohmann::json(rope_attention_factor(spec)).dump()}});
  }
  // transformers-js: a folder laid out as transformers.js loads a causal LM (config.json, onnx/model.onnx).
  const std::string flag = format == "transformers-js" ? " --transformers-js" : "";
  const int rc = run(shell_quoted(python) + " " + shell_quoted(script) + flag + " " + shell_quoted(in) + " " + shell_quoted(out) + " >&2");
  if (rc != 0) throw std::runtime_error("export --format " + format + ": " + script + " exited with status " + std::to_string(rc));
}

}  // namespace tinygpt::checks
