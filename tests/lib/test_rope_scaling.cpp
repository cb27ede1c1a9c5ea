// RoPE's frequencies for the zoo (rope_scaling.h, SPEC 10), by the rules SPEC 10 states: each
// scaling's effect on the frequencies it must change and on those it must leave, YaRN's attention
// factor, and validation naming the field. (tests/zoo/rope_scaling_vs_transformers.py holds the same
// functions against transformers' own, value by value, where the forky chroot is there.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "tinygpt/rope.h"
#include "tinygpt/rope_scaling.h"

namespace tinygpt {
namespace {

using Kind = RopeScaling::Kind;

RopeSpec spec(double theta, int64_t hd, Kind kind = Kind::None, double factor = 1, int64_t original = 0) {
  RopeSpec s;
  s.theta = theta;
  s.head_dim = hd;
  s.scaling.kind = kind;
  s.scaling.factor = factor;
  s.scaling.original_context = original;
  return s;
}

TEST(RopeScaling, UnscaledIsThetaToTheMinusTwoJOverR) {
  const at::Tensor f = rope_inv_frequencies(spec(10000, 64));
  ASSERT_EQ(f.sizes(), (std::vector<int64_t>{32}));
  for (int64_t j : {0, 1, 17, 31})
    EXPECT_NEAR(f[j].item<double>(), std::pow(10000.0, -2.0 * j / 64), 1e-7 * std::pow(10000.0, -2.0 * j / 64)) << j;
  EXPECT_EQ(rope_attention_factor(spec(10000, 64)), 1.0);
}

TEST(RopeScaling, PartialRotaryRotatesAFractionWithItsOwnExponent) {
  RopeSpec s = spec(10000, 64);
  s.partial_rotary = 0.25;
  EXPECT_EQ(s.rotated(), 16);
  const at::Tensor f = rope_inv_frequencies(s);
  ASSERT_EQ(f.size(0), 8);
  EXPECT_NEAR(f[1].item<double>(), std::pow(10000.0, -2.0 / 16), 1e-7);  // the exponent runs over the rotated width
}

TEST(RopeScaling, LinearDividesEveryFrequency) {
  const at::Tensor plain = rope_inv_frequencies(spec(10000, 64));
  EXPECT_TRUE(rope_inv_frequencies(spec(10000, 64, Kind::Linear, 4)).equal(plain / 4.0));
}

TEST(RopeScaling, Llama3LeavesShortWavesDividesLongOnesAndBlendsBetween) {
  // C = 128, a = 1, b = 4: wavelengths under 32 unchanged, over 128 divided by the factor, between blended.
  RopeSpec s = spec(10000, 64, Kind::Llama3, 4, 128);
  const at::Tensor plain = rope_inv_frequencies(spec(10000, 64));
  const at::Tensor f = rope_inv_frequencies(s);
  int shorter = 0, longer = 0, between = 0;
  for (int64_t j = 0; j < 32; ++j) {
    const double p = plain[j].item<double>(), got = f[j].item<double>(), wavelen = 2 * 3.14159265358979323846 / p;
    if (wavelen < 32) {
      EXPECT_EQ(got, p) << j;
      ++shorter;
    } else if (wavelen > 128) {
      EXPECT_NEAR(got, p / 4, 1e-7 * p) << j;
      ++longer;
    } else {
      EXPECT_GT(got, p / 4 * (1 - 1e-6)) << j;
      EXPECT_LT(got, p * (1 + 1e-6)) << j;
      ++between;
    }
  }
  EXPECT_GT(shorter, 0);
  EXPECT_GT(longer, 0);
  EXPECT_GT(between, 0);  // this spec crosses every branch
  EXPECT_EQ(rope_attention_factor(s), 1.0);
}

TEST(RopeScaling, YarnRampsFromExtrapolationToInterpolationAndScalesAttention) {
  const RopeSpec s = spec(10000, 64, Kind::Yarn, 4, 64);
  const at::Tensor plain = rope_inv_frequencies(spec(10000, 64));
  const at::Tensor f = rope_inv_frequencies(s);
  EXPECT_NEAR(f[0].item<double>(), plain[0].item<double>(), 1e-7);           // the fastest pairs keep theirs
  EXPECT_NEAR(f[31].item<double>(), plain[31].item<double>() / 4, 1e-10);    // the slowest are interpolated
  for (int64_t j = 0; j < 32; ++j) {
    EXPECT_LE(f[j].item<double>(), plain[j].item<double>() * (1 + 1e-6)) << j;
    EXPECT_GE(f[j].item<double>(), plain[j].item<double>() / 4 * (1 - 1e-6)) << j;
  }
  EXPECT_NEAR(rope_attention_factor(s), 0.1 * std::log(4.0) + 1, 1e-15);
  RopeSpec given = s;
  given.scaling.attention_factor = 1.25;
  EXPECT_EQ(rope_attention_factor(given), 1.25);
  EXPECT_EQ(rope_attention_factor(spec(10000, 64, Kind::Yarn, 0.5, 64)), 1.0);  // no stretch, no factor
}

TEST(RopeScaling, ValidationNamesTheField) {
  auto says = [](const RopeSpec& s, const std::string& what) {
    try {
      validate(s);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted a spec without " << what;
  };
  says(spec(1, 64), "theta");
  RopeSpec odd = spec(10000, 64);
  odd.partial_rotary = 0.3;  // 19 channels
  says(odd, "rotated width");
  says(spec(10000, 64, Kind::Linear, 0), "factor");
  says(spec(10000, 64, Kind::Llama3, 8, 0), "original context");
  RopeSpec inverted = spec(10000, 64, Kind::Llama3, 8, 8192);
  inverted.scaling.low_freq_factor = 4;
  inverted.scaling.high_freq_factor = 1;
  says(inverted, "high_freq_factor");
  RopeSpec betas = spec(10000, 64, Kind::Yarn, 4, 64);
  betas.scaling.beta_fast = 1;
  says(betas, "beta_fast");
  EXPECT_THROW(rope_scaling_kind("dynamic"), std::invalid_argument);
  EXPECT_EQ(rope_scaling_kind("yarn"), Kind::Yarn);
}

// SPEC 10: the two pairings are one model under a fixed permutation of the channels; the seed's RoPE
// (rope.h, adjacent pairs) is rope_apply's adjacent rotation at theta 1e4 with no scaling.
TEST(RopeApply, AdjacentPairsAreHalvesUnderTheInterleavingPermutation) {
  const RopeSpec s = spec(10000, 8);
  const at::Tensor x = at::randn({2, 3, 5, 8}, at::kFloat);
  const at::Tensor pos = at::tensor(std::vector<int64_t>{0, 3, 255, 256, 1000});
  const at::Tensor perm = at::tensor(std::vector<int64_t>{0, 2, 4, 6, 1, 3, 5, 7});  // (2j, 2j+1) -> (j, j + 4)
  const at::Tensor inverse = at::argsort(perm);
  const at::Tensor adjacent = rope_apply(x, pos, s, RopePairing::Adjacent);
  const at::Tensor halves = rope_apply(x.index_select(-1, perm), pos, s, RopePairing::Halves).index_select(-1, inverse);
  EXPECT_TRUE(adjacent.equal(halves));
  EXPECT_FALSE(adjacent.equal(rope_apply(x, pos, s, RopePairing::Halves)));  // and the two do differ on one layout
  // The seed's RoPE: the same rotation (its angles are computed as pow(theta, -2j/hd), ours as 1 / pow: an ulp apart).
  const at::Tensor x1 = x.narrow(2, 0, 3);
  const at::Tensor seed = rope(x1, 254);  // positions 254, 255, 256
  const at::Tensor ours = rope_apply(x1, at::arange(254, 257, at::kLong), spec(10000, 8), RopePairing::Adjacent);
  EXPECT_LT((seed - ours).abs().max().item<double>(), 1e-5);
}

TEST(RopeApply, PartialRotationPassesTheRestAndTheAttentionFactorScalesEveryPair) {
  RopeSpec s = spec(10000, 16, Kind::Yarn, 4, 64);
  s.partial_rotary = 0.5;
  const at::Tensor x = at::randn({1, 2, 4, 16}, at::kFloat);
  const at::Tensor pos = at::tensor(std::vector<int64_t>{1, 64, 257, 3000});
  const at::Tensor y = rope_apply(x, pos, s, RopePairing::Halves);
  EXPECT_TRUE(y.narrow(-1, 8, 8).equal(x.narrow(-1, 8, 8)));  // channels past the rotated width untouched
  // Pair j of the halves convention is (j, j + 4) inside the rotated 8: its length grows by the factor.
  const double m = rope_attention_factor(s);
  for (int64_t j = 0; j < 4; ++j) {
    const at::Tensor before = at::hypot(x.select(-1, j), x.select(-1, j + 4));
    const at::Tensor after = at::hypot(y.select(-1, j), y.select(-1, j + 4));
    EXPECT_LT((after - before * m).abs().max().item<double>(), 1e-5) << j;
  }
  EXPECT_THROW(rope_apply(x, pos.narrow(0, 0, 3), s, RopePairing::Halves), std::invalid_argument);  // positions (T)
  EXPECT_THROW(rope_apply(x.narrow(-1, 0, 8), pos, s, RopePairing::Halves), std::invalid_argument);  // head size
}

}  // namespace
}  // namespace tinygpt
