// RoPE (SPEC 2): a rotation (norms kept), relative (scores depend on distance only), and the
// start offset equals slicing a longer table. Also checked against a scalar re-derivation.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tinygpt/rope.h"

namespace tinygpt {
namespace {

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat);
}

TEST(Rope, KeepsNorms) {
  at::Tensor x = randn({2, 4, 50, 64}, 1);
  at::Tensor r = rope(x, 17);
  EXPECT_TRUE(at::allclose(x.norm(2, -1), r.norm(2, -1), 1e-5, 1e-5));
}

// q.k after rotation depends only on the distance between their positions.
TEST(Rope, ScoreDependsOnlyOnDistance) {
  at::Tensor q = randn({64}, 2), k = randn({64}, 3);
  auto score = [&](int64_t pq, int64_t pk) {
    return (rope(q.view({1, 64}), pq) * rope(k.view({1, 64}), pk)).sum().item<double>();
  };
  const double s0 = score(10, 3);
  EXPECT_NEAR(score(110, 103), s0, 1e-4);
  EXPECT_NEAR(score(507, 500), s0, 1e-4);
  EXPECT_GT(std::abs(score(10, 4) - s0), 1e-3) << "a different distance should change the score";
}

TEST(Rope, StartOffsetEqualsRowsOfALongerTable) {
  at::Tensor x = randn({3, 40, 64}, 4);
  at::Tensor longer = at::cat({randn({3, 25, 64}, 5), x}, 1);  // x sits at rows 25..64
  EXPECT_TRUE(at::allclose(rope(x, 25), rope(longer, 0).narrow(1, 25, 40), 1e-6, 1e-5));
}

TEST(Rope, MatchesTheScalarFormula) {
  at::Tensor x = randn({5, 8}, 6);
  at::Tensor r = rope(x, 100);
  for (int t = 0; t < 5; ++t)
    for (int j = 0; j < 4; ++j) {
      const double ang = (100.0 + t) * std::pow(10000.0, -2.0 * j / 8.0);
      const double a = x[t][2 * j].item<double>(), b = x[t][2 * j + 1].item<double>();
      EXPECT_NEAR(r[t][2 * j].item<double>(), a * std::cos(ang) - b * std::sin(ang), 1e-4);
      EXPECT_NEAR(r[t][2 * j + 1].item<double>(), a * std::sin(ang) + b * std::cos(ang), 1e-4);
    }
}

TEST(Rope, RejectsOddHeadDimAndNegativeStart) {
  EXPECT_THROW(rope(at::zeros({2, 7}), 0), std::invalid_argument);
  EXPECT_THROW(rope(at::zeros({2, 8}), -1), std::invalid_argument);
}

}  // namespace
}  // namespace tinygpt

namespace tinygpt {
namespace {

// The model reads cos and sin from a table computed once; it must be the formula bit for bit, at
// any start and across the table's growth.
TEST(RopeTable, IsTheFormulaBitForBit) {
  at::Tensor x = randn({2, 4, 9, 64}, 20);
  for (int64_t start : std::vector<int64_t>{0, 1, 255, 256, 1023, 5000, kRopeTableMax - 3, kRopeTableMax + 10}) {
    auto [cos, sin] = rope_angles(start, 9, 64, c10::Device(c10::kCPU));
    ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{9, 32}));
    EXPECT_TRUE(rope_rotate(x, cos, sin).equal(rope(x, start))) << "start " << start;
  }
}

// The fused CPU rotation equals the op-by-op one on strided input (q, k are views of qkv).
TEST(RopeTable, FusedRotationTakesStridedViews) {
  at::Tensor qkv = randn({2, 5, 3 * 256}, 21);
  at::Tensor q = qkv.narrow(2, 0, 256).view({2, 5, 4, 64}).transpose(1, 2);  // (2, 4, 5, 64), strided
  auto [cos, sin] = rope_angles(17, 5, 64, c10::Device(c10::kCPU));
  EXPECT_TRUE(rope_rotate(q, cos, sin).equal(rope(q, 17)));
  EXPECT_TRUE(rope_rotate(q.to(at::kDouble), cos, sin).equal(rope(q.to(at::kDouble), 17)));
}

TEST(RopeTable, RejectsBadArguments) {
  EXPECT_THROW(rope_angles(-1, 2, 64, c10::Device(c10::kCPU)), std::invalid_argument);
  EXPECT_THROW(rope_angles(0, 2, 7, c10::Device(c10::kCPU)), std::invalid_argument);
}

}  // namespace
}  // namespace tinygpt
