// A Hugging Face checkpoint directory read by our loader (hf_checkpoint.h) and run by our model: the
// logits of every position for the given ids, as JSON {"logits": [[...], ...], "config": "..."}, for
// hf_vs_transformers.py to hold against transformers' own forward.
//   zoo_hf_dump DIR ID,ID,... [--plant NAME]
//   zoo_hf_dump --jobs      one job a line on stdin, DIR<TAB>ID,ID,...[<TAB>NAME], one JSON line out for each
//                           ({"error": "..."} for a job that failed): the many directories and plants of a
//                           test in one process, which pays LibTorch's start (about 0.5 s) once.
// --plant changes one knob of what was read the way a converter bug would (no-sliding,
// no-softcap, no-qk-norm, full-rotary, no-rope-scaling, sequential-residual); the comparison must then
// fail on exactly the members with that feature.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tinygpt/checkpoint.h"

namespace {

nlohmann::json dump(const std::string& dir, const std::string& id_list, const std::string& plant) {
  tinygpt::Checkpoint ck = tinygpt::read_any_checkpoint(dir);
  tinygpt::Config& c = ck.config;
  if (plant == "no-sliding") c.layer_types.clear(), c.sliding_window = 0;
  else if (plant == "no-softcap") c.attn_softcap = 0, c.final_softcap = 0;
  else if (plant == "full-rotary") c.partial_rotary = 1;
  else if (plant == "no-rope-scaling") c.rope_scaling = tinygpt::RopeScaling{};
  else if (plant == "sequential-residual") c.parallel_residual = false;
  else if (plant == "no-qk-norm") {
    c.qk_norm = false;
    std::vector<std::pair<std::string, at::Tensor>> kept;
    for (auto& t : ck.tensors)
      if (t.first.find("_norm.") == std::string::npos || t.first.find("attn.") == std::string::npos) kept.push_back(t);
    ck.tensors = kept;
  } else if (!plant.empty()) {
    throw std::invalid_argument("unknown plant " + plant);
  }
  tinygpt::GPT model = tinygpt::model_from_checkpoint(ck, at::kCPU, dir);
  std::vector<int64_t> ids;
  std::stringstream in(id_list);
  for (std::string tok; std::getline(in, tok, ',');) ids.push_back(std::stoll(tok));
  at::NoGradGuard ng;
  const at::Tensor logits = model->forward(at::tensor(ids).view({1, -1})).select(0, 0).contiguous();  // (T, V)
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t t = 0; t < logits.size(0); ++t) {
    const float* p = logits[t].data_ptr<float>();
    rows.push_back(std::vector<double>(p, p + logits.size(1)));
  }
  return nlohmann::json{{"logits", rows}, {"config", c.to_string()}};
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 2 && std::string(argv[1]) == "--jobs") {
    for (std::string line; std::getline(std::cin, line);) {
      std::vector<std::string> f;
      std::stringstream in(line);
      for (std::string x; std::getline(in, x, '\t');) f.push_back(x);
      if (f.size() < 2 || f.size() > 3) {
        std::cout << nlohmann::json{{"error", "a job is DIR<TAB>IDS[<TAB>PLANT]"}}.dump() << std::endl;
        continue;
      }
      try {
        std::cout << dump(f[0], f[1], f.size() == 3 ? f[2] : "").dump() << std::endl;
      } catch (const std::exception& e) {
        std::cout << nlohmann::json{{"error", e.what()}}.dump() << std::endl;
      }
    }
    return 0;
  }
  if (argc != 3 && !(argc == 5 && std::string(argv[3]) == "--plant")) {
    std::cerr << "usage: zoo_hf_dump DIR ID,ID,... [--plant NAME] | zoo_hf_dump --jobs\n";
    return 2;
  }
  std::cout << dump(argv[1], argv[2], argc == 5 ? argv[4] : "").dump() << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "zoo_hf_dump: " << e.what() << "\n";
  return 1;
}
