// A Hugging Face checkpoint directory read by our loader (hf_checkpoint.h) and run by our model: the
// logits of every position for the given ids, as JSON {"logits": [[...], ...], "config": "..."}, for
// hf_vs_transformers.py to hold against transformers' own forward.
//   zoo_hf_dump DIR ID,ID,... [--plant NAME]
// --plant changes one knob of what was read the way a converter bug would (no-sliding,
// no-softcap, no-qk-norm, full-rotary, no-rope-scaling, sequential-residual); the comparison must then
// fail on exactly the members with that feature.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "tinygpt/checkpoint.h"

int main(int argc, char** argv) try {
  if (argc != 3 && !(argc == 5 && std::string(argv[3]) == "--plant")) {
    std::cerr << "usage: zoo_hf_dump DIR ID,ID,... [--plant NAME]\n";
    return 2;
  }
  tinygpt::Checkpoint ck = tinygpt::read_any_checkpoint(argv[1]);
  const std::string plant = argc == 5 ? argv[4] : "";
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
    std::cerr << "zoo_hf_dump: unknown plant " << plant << "\n";
    return 2;
  }
  tinygpt::GPT model = tinygpt::model_from_checkpoint(ck, at::kCPU, argv[1]);
  std::vector<int64_t> ids;
  std::stringstream in(argv[2]);
  for (std::string tok; std::getline(in, tok, ',');) ids.push_back(std::stoll(tok));
  at::NoGradGuard ng;
  const at::Tensor logits = model->forward(at::tensor(ids).view({1, -1})).select(0, 0).contiguous();  // (T, V)
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t t = 0; t < logits.size(0); ++t) {
    const float* p = logits[t].data_ptr<float>();
    rows.push_back(std::vector<double>(p, p + logits.size(1)));
  }
  std::cout << nlohmann::json{{"logits", rows}, {"config", c.to_string()}}.dump() << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "zoo_hf_dump: " << e.what() << "\n";
  return 1;
}
