// Our RoPE frequencies for a list of specs, as JSON, for rope_scaling_vs_transformers.py to hold
// against transformers' own. Reads [{"name", "theta", "head_dim", "partial_rotary", "scaling": {...}}]
// from the file argv[1]; writes [{"name", "inv_freq": [...], "attention_factor"}] to stdout, or
// {"name", "error"} for a spec our validation refuses.
// Also "rotated": x (1, 2, T, hd) at hf_rope.py's POSITIONS, x[i] = ((i * 7919) % 2003) / 1000 - 1,
// through rope_apply with halves pairing (transformers' convention), flattened.
//   rope_dump SPECS.json [--plant yarn-attention-factor-missing|llama3-factors-missing|
//                                 partial-rotary-rotates-all|pairing-adjacent]
// --plant changes our answer the way a known engine bug does (the comparison must then fail: that is
// how the test shows it can).
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tinygpt/rope_scaling.h"

namespace {
const std::vector<int64_t> kPositions = {0, 1, 2, 17, 63, 64, 65, 255, 256, 257, 511, 1000, 4095};  // hf_rope.py's

at::Tensor probe(int64_t hd) {
  const int64_t T = static_cast<int64_t>(kPositions.size()), n = 2 * T * hd;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(static_cast<double>((i * 7919) % 2003) / 1000.0 - 1.0);
  return at::tensor(v).view({1, 2, T, hd});
}
}  // namespace

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
      tinygpt::RopeSpec r = s;
      if (plant == "yarn-attention-factor-missing") r.scaling.attention_factor = 1.0;
      if (plant == "partial-rotary-rotates-all") r.partial_rotary = 1.0;  // llama.cpp's rope.dimension_count ignored
      const auto pairing = plant == "pairing-adjacent" ? tinygpt::RopePairing::Adjacent : tinygpt::RopePairing::Halves;
      const at::Tensor y = tinygpt::rope_apply(probe(s.head_dim), at::tensor(kPositions, at::kLong), r, pairing).contiguous();
      const float* q = y.data_ptr<float>();
      row["rotated"] = std::vector<double>(q, q + y.numel());
    } catch (const std::invalid_argument& e) {
      row["error"] = e.what();
    }
    out.push_back(row);
  }
  std::cout << out.dump() << "\n";
  return 0;
}
