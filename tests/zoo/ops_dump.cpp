// Our zoo building blocks (zoo_ops.h) on fixed probes, as JSON {case: [values...]}, for
// zoo_ops_vs_transformers.py to hold against transformers' modules on the same probes (hf_ops.py
// builds them with the same formula: x[i] = ((i * 7919 + seed) % 2003) / 1000 - 1, in float32).
//   zoo_ops_dump [--plant norm-plus-one-twice|softcap-missing|gqa-heads-interleaved]
// --plant computes one case the way a known engine bug does; the comparison must then fail on it.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "tinygpt/zoo_ops.h"

namespace {

at::Tensor probe(const std::vector<int64_t>& shape, int64_t seed) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(static_cast<double>((i * 7919 + seed) % 2003) / 1000.0 - 1.0);
  return at::tensor(v).view(shape);
}

std::vector<double> flat(const at::Tensor& t) {
  const at::Tensor c = t.contiguous().to(at::kFloat);
  const float* p = c.data_ptr<float>();
  return std::vector<double>(p, p + c.numel());
}

// (T, S) additive: query i (the last T of S positions) sees keys j <= S - T + i.
at::Tensor causal(int64_t T, int64_t S) {
  const at::Tensor i = at::arange(T, at::kLong).unsqueeze(1), j = at::arange(S, at::kLong).unsqueeze(0);
  return at::zeros({T, S}).masked_fill(j > i + (S - T), -std::numeric_limits<float>::infinity());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tinygpt;
  const std::string plant = argc == 3 && std::string(argv[1]) == "--plant" ? argv[2] : "";
  if (argc != 1 && plant.empty()) {
    std::cerr << "usage: zoo_ops_dump [--plant NAME]\n";
    return 2;
  }
  nlohmann::json out;
  const at::Tensor x = probe({2, 5, 48}, 0);
  const at::Tensor w = probe({48}, 1) * 0.5 + 1.0;
  out["rmsnorm"] = flat(zoo_norm(x, w, {}, 1e-6, NormKind::RMSNorm));
  const at::Tensor wg = probe({48}, 2) * 0.5;
  at::Tensor gemma = zoo_norm(x, wg, {}, 1e-6, NormKind::RMSNormPlusOne);
  if (plant == "norm-plus-one-twice") gemma = zoo_norm(x, wg + 1.0, {}, 1e-6, NormKind::RMSNormPlusOne);  // vLLM PR #31464
  out["rmsnorm_plus_one"] = flat(gemma);
  const at::Tensor gate = probe({96, 48}, 3) * 0.1, up = probe({96, 48}, 4) * 0.1, down = probe({48, 96}, 5) * 0.1;
  out["swiglu"] = flat(gated_mlp(x, gate, up, down, Activation::Silu));
  out["geglu"] = flat(gated_mlp(x, gate, up, down, Activation::GeluTanh));
  // Attention: 6 query heads over 2 KV heads (and over 1), 7 queries at the end of 9 keys, hd 16,
  // Gemma 2's scale query_pre_attn_scalar^-0.5 with 24, and its soft-cap at 5 (small enough to bite).
  const at::Tensor q = probe({1, 6, 7, 16}, 6) * 3.0, k = probe({1, 2, 9, 16}, 7) * 3.0, v = probe({1, 2, 9, 16}, 8);
  const double scale = 1.0 / std::sqrt(24.0);
  auto attention = [&](const at::Tensor& K, const at::Tensor& V, std::optional<double> cap) {
    if (plant == "gqa-heads-interleaved" && K.size(1) > 1) {  // query head h reads KV head h % G (SGLang PR #19086's kind)
      const int64_t g = q.size(1) / K.size(1);
      return zoo_attention(q, K.repeat({1, g, 1, 1}), V.repeat({1, g, 1, 1}), causal(7, 9), scale, cap);
    }
    return zoo_attention(q, K, V, causal(7, 9), scale, cap);
  };
  out["attention_gqa_softcap"] = flat(attention(k, v, plant == "softcap-missing" ? std::nullopt : std::optional<double>(5.0)));
  out["attention_gqa"] = flat(attention(k, v, std::nullopt));
  out["attention_mqa"] = flat(attention(k.narrow(1, 0, 1), v.narrow(1, 0, 1), std::nullopt));
  std::cout << out.dump() << "\n";
  return 0;
}
