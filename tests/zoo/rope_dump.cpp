// Our RoPE frequencies for a list of specs, as JSON, for rope_scaling_vs_transformers.py to hold
// against transformers' own. Reads [{"name", "theta", "head_dim", "partial_rotary", "scaling": {...}}]
// from the file argv[1]; writes [{"name", "inv_freq": [...], "attention_factor"}] to stdout, or
// {"name", "error"} for a spec our validation refuses.
//   rope_dump SPECS.json [--plant yarn-attention-factor-missing|llama3-factors-missing]
// --plant changes our answer the way a known engine bug does (the comparison must then fail: that is
// how the test shows it can).
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <string>

#include "tinygpt/rope_scaling.h"

int main(int argc, char** argv) {
  using nlohmann::json;
  if (argc != 2 && argc != 4) {
    std::cerr << "usage: rope_dump SPECS.json [--plant NAME]\n";
    return 2;
  }
  const std::string plant = argc == 4 ? argv[3] : "";
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "rope_dump: cannot read " << argv[1] << "\n";
    return 2;
  }
  const json specs = json::parse(in);
  json out = json::array();
  for (const auto& j : specs) {
    tinygpt::RopeSpec s;
    s.theta = j.value("theta", 10000.0);
    s.head_dim = j.value("head_dim", int64_t{64});
    s.partial_rotary = j.value("partial_rotary", 1.0);
    if (j.contains("scaling")) {
      const json& c = j["scaling"];
      s.scaling.kind = tinygpt::rope_scaling_kind(c.value("kind", std::string("none")));
      s.scaling.factor = c.value("factor", 1.0);
      s.scaling.low_freq_factor = c.value("low_freq_factor", 1.0);
      s.scaling.high_freq_factor = c.value("high_freq_factor", 4.0);
      s.scaling.original_context = c.value("original_context", int64_t{0});
      s.scaling.beta_fast = c.value("beta_fast", 32.0);
      s.scaling.beta_slow = c.value("beta_slow", 1.0);
      if (c.contains("attention_factor")) s.scaling.attention_factor = c["attention_factor"].get<double>();
      s.scaling.truncate = c.value("truncate", true);
    }
    json row = {{"name", j.at("name")}};
    try {
      at::Tensor f = tinygpt::rope_inv_frequencies(s);
      double m = tinygpt::rope_attention_factor(s);
      if (plant == "yarn-attention-factor-missing") m = 1.0;  // vLLM #48623, transformers #47435: mscale ignored
      if (plant == "llama3-factors-missing" && s.scaling.kind == tinygpt::RopeScaling::Kind::Llama3) {
        s.scaling.kind = tinygpt::RopeScaling::Kind::None;  // llama.cpp PR #8676: Llama 3.1's rope factors not applied
        f = tinygpt::rope_inv_frequencies(s);
      }
      const float* p = f.data_ptr<float>();
      row["inv_freq"] = std::vector<double>(p, p + f.numel());
      row["attention_factor"] = m;
    } catch (const std::invalid_argument& e) {
      row["error"] = e.what();
    }
    out.push_back(row);
  }
  std::cout << out.dump() << "\n";
  return 0;
}
