// The zoo's building blocks (zoo_ops.h, SPEC 10) by the rules SPEC 10 states; tests/zoo/
// zoo_ops_vs_transformers.py holds them value by value against transformers where the forky chroot is.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "tinygpt/attention_policy.h"
#include "tinygpt/zoo_ops.h"

namespace tinygpt {
namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(ZooOps, GroupedHeadsReadTheirGroupsKvHead) {
  const at::Tensor K = at::randn({1, 2, 5, 4});
  const at::Tensor E = expand_kv(K, 3);  // 6 query heads over 2 KV heads
  ASSERT_EQ(E.sizes(), (std::vector<int64_t>{1, 6, 5, 4}));
  for (int64_t h = 0; h < 6; ++h) EXPECT_TRUE(E.select(1, h).equal(K.select(1, h / 3))) << h;  // not h % 2
  EXPECT_TRUE(expand_kv(K, 1).equal(K));
  EXPECT_THROW(expand_kv(K, 0), std::invalid_argument);
}

TEST(ZooOps, AttentionWithEveryHeadItsOwnAndNoCapIsTheReference) {
  const at::Tensor q = at::randn({2, 4, 3, 8}), K = at::randn({2, 4, 5, 8}), V = at::randn({2, 4, 5, 8});
  const at::Tensor mask = causal_mask(3, 5, 0, q.options());
  EXPECT_LT(max_diff(zoo_attention(q, K, V, mask, 1 / std::sqrt(8.0), std::nullopt), attention_reference(q, K, V, mask)), 1e-6);
  EXPECT_THROW(zoo_attention(q, K.narrow(1, 0, 3), V.narrow(1, 0, 3), mask, 1.0, std::nullopt), std::invalid_argument);
}

TEST(ZooOps, SoftcapBoundsAndKeepsSmallScores) {
  const at::Tensor s = at::linspace(-200, 200, 101);
  const at::Tensor c = softcap(s, 50);
  EXPECT_LT(c.abs().max().item<double>(), 50.0);
  EXPECT_NEAR(softcap(at::tensor({0.5}), 50).item<double>(), 50 * std::tanh(0.01), 1e-7);  // c tanh(s / c): ~s when small
  EXPECT_THROW(softcap(s, 0), std::invalid_argument);
}

TEST(ZooOps, NormsByTheirFormulas) {
  const at::Tensor x = at::randn({3, 16});
  const at::Tensor w = at::randn({16}), zero = at::zeros({16}), one = at::ones({16});
  // Gemma's (1 + w) with w = 0 is RMSNorm with w = 1; RMSNorm is x / rms(x) * w.
  EXPECT_LT(max_diff(zoo_norm(x, zero, {}, 1e-6, NormKind::RMSNormPlusOne), zoo_norm(x, one, {}, 1e-6, NormKind::RMSNorm)), 1e-6);
  const at::Tensor rms = (x.pow(2).mean(-1, true) + 1e-6).sqrt();
  EXPECT_LT(max_diff(zoo_norm(x, w, {}, 1e-6, NormKind::RMSNorm), x / rms * w), 1e-5);
  EXPECT_TRUE(zoo_norm(x, w, at::zeros({16}), 1e-5, NormKind::LayerNorm).equal(at::layer_norm(x, {16}, w, at::zeros({16}), 1e-5)));
  EXPECT_THROW(zoo_norm(x, at::ones({8}), {}, 1e-6, NormKind::RMSNorm), std::invalid_argument);
}

TEST(ZooOps, GatedMlpIsDownOfActGateTimesUp) {
  const at::Tensor x = at::randn({2, 8}), gate = at::randn({12, 8}), up = at::randn({12, 8}), down = at::randn({8, 12});
  const at::Tensor g = x.matmul(gate.t()), u = x.matmul(up.t());
  EXPECT_LT(max_diff(gated_mlp(x, gate, up, down, Activation::Silu), (g * at::sigmoid(g) * u).matmul(down.t())), 1e-4);
  const at::Tensor tanh_gelu = 0.5 * g * (1 + at::tanh(std::sqrt(2 / 3.14159265358979323846) * (g + 0.044715 * g.pow(3))));
  EXPECT_LT(max_diff(gated_mlp(x, gate, up, down, Activation::GeluTanh), (tanh_gelu * u).matmul(down.t())), 1e-4);
}

}  // namespace
}  // namespace tinygpt
