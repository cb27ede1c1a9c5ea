#include "tinygpt/checkpoint.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "tinygpt/errors.h"
#include "tinygpt/hf_checkpoint.h"
#include "tinygpt/safetensors.h"
#include "tinygpt/kernel_step.h"
#include "tinygpt/torch_checkpoint.h"

namespace tinygpt {

namespace {
[[noreturn]] void fail(const std::string& path, const std::string& what) { throw InputError(path + ": " + what); }
}  // namespace

Checkpoint read_any_checkpoint(const std::string& path) {
  if (is_hf_directory(path)) return read_hf_checkpoint(path);  // config.json + model.safetensors
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path, "a directory without config.json (not a Hugging Face checkpoint)");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open checkpoint");
  char magic[2] = {0, 0};
  in.read(magic, 2);
  // A zip (torch.save) starts with "PK"; anything else is read as safetensors, which checks itself.
  if (magic[0] == 'P' && magic[1] == 'K') return read_torch_checkpoint(path);
  return read_safetensors_checkpoint(path);
}

void load_weights(GPT& model, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  std::vector<std::string>* notes) {
  std::map<std::string, at::Tensor> want;
  for (const auto& [name, t] : model->state_dict()) want[name] = t;
  std::map<std::string, at::Tensor> got;
  std::vector<std::string> unexpected, problems;
  for (const auto& [name, t] : tensors) {
    if (!want.count(name)) unexpected.push_back(name);
    else got[name] = t;
  }
  std::vector<std::string> missing;
  for (const auto& [name, t] : want)
    if (!got.count(name)) missing.push_back(name);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!missing.empty() || !unexpected.empty())
    throw InputError("state dict does not match the model: missing [" + list(missing) + "], unexpected [" +
                             list(unexpected) + "]");
  std::map<std::string, at::Tensor> ready;
  for (const auto& [name, t] : got) {
    const auto& target = want[name];
    if (t.sizes() != target.sizes()) {
      std::ostringstream s;
      s << name << ": shape mismatch, expected " << target.sizes() << ", got " << t.sizes();
      throw InputError(s.str());
    }
    at::Tensor f = t;
    if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) {
      if (notes) notes->push_back(name + ": converted " + std::string(c10::toString(t.scalar_type())) + " to float32");
      f = t.to(at::kFloat);
    } else if (t.scalar_type() != at::kFloat) {
      throw InputError(name + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                               " refused (float32, float16 and bfloat16 are accepted)");
    }
    const int64_t bad = (~at::isfinite(f)).sum().item<int64_t>();
    if (bad) throw InputError(name + ": " + std::to_string(bad) + " NaN or Inf values");
    ready[name] = f;
  }
  if (model->config().tied_embeddings && !ready["head.weight"].equal(ready["emb.weight"]))
    throw InputError("head.weight differs from emb.weight: the series ties the head to the embedding");
  at::NoGradGuard no_grad;
  for (auto& [name, t] : want)
    if (name != "head.weight" || !model->config().tied_embeddings) t.copy_(ready[name]);
}

GPT model_from_checkpoint(const Checkpoint& ck, c10::Device device, const std::string& path, std::vector<std::string>* notes) {
  GPT model(ck.config, WeightsToFill{});
  try {
    load_weights(model, ck.tensors, notes);
  } catch (const std::exception& e) {
    throw InputError(path + ": " + e.what());
  }
  model->to(device);
  if (device.is_cpu()) pack_parameters(*model);  // the decode path streams them in one run
  model->eval();
  return model;
}

GPT load_checkpoint(const std::string& path, c10::Device device, std::vector<std::string>* notes) {
  return model_from_checkpoint(read_any_checkpoint(path), device, path, notes);
}

}  // namespace tinygpt
