// The int8 KV cache (int8_kv_cache.h): its quantization's error bound, its memory by SPEC's formula
// at 1 byte per value plus the scales, the rolling cache's window and row operations.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tinygpt/int8_kv_cache.h"
#include "tinygpt/kv_cache.h"

namespace tinygpt {
namespace {

TEST(Int8Cache, QuantizationIsWithinHalfAStepAndMapsTheAbsmaxTo127) {
  at::manual_seed(3);
  at::Tensor x = at::randn({2, 4, 5, 16});  // (B, H, T, hd)
  x.index_put_({0, 1, 2}, at::zeros({16}));  // an all-zero head row
  const auto q = Int8KVCache::quantize(x);
  ASSERT_EQ(q.q.scalar_type(), at::kChar);
  ASSERT_EQ(q.scale.sizes(), (at::IntArrayRef{2, 4, 5, 1}));
  const at::Tensor back = q.q.to(at::kFloat) * q.scale;
  EXPECT_TRUE(((back - x).abs() <= q.scale * 0.5 + 1e-7).all().item<bool>()) << "an entry off by more than half a step";
  const at::Tensor top = q.q.abs().amax(-1);  // (B, H, T)
  EXPECT_EQ(top[0][1][2].item<int>(), 0) << "a zero row quantizes to zeros";
  EXPECT_EQ(q.scale[0][1][2][0].item<float>(), 1.f);
  EXPECT_EQ((top == 127).sum().item<int64_t>(), top.numel() - 1) << "every other row's absmax maps to +-127";
  // Truncation rounds toward zero: never further from zero than x, and off by up to a whole step.
  const auto t = Int8KVCache::quantize_with(x, q.scale, /*trunc=*/true);
  const at::Tensor tb = t.q.to(at::kFloat) * q.scale;
  EXPECT_TRUE((tb.abs() <= x.abs() + 1e-6).all().item<bool>());
  EXPECT_GT((tb - x).abs().max().item<double>(), (back - x).abs().max().item<double>());
}

TEST(Int8Cache, DequantizedEntriesQuantizeBackToThemselves) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({1, 2, 7, 8});
  const auto q = Int8KVCache::quantize(x);
  const auto again = Int8KVCache::quantize(q.q.to(at::kFloat) * q.scale);
  EXPECT_TRUE(again.q.equal(q.q)) << "a restore or a shift, which append dequantized entries, would drift";
}

TEST(Int8Cache, KeepsTheRollingWindowAtOneBytePerValuePlusScales) {
  const int64_t L = 2, ctx = 8, H = 2, hd = 4;
  Int8KVCache c(L, ctx);
  RollingKVCache r(L, ctx);
  at::manual_seed(5);
  for (int64_t step = 0; step < ctx + 5; ++step) {
    const int64_t T = step == 0 ? 3 : 1;
    for (int64_t l = 0; l < L; ++l) {
      const at::Tensor k = at::randn({1, H, T, hd}), v = at::randn({1, H, T, hd});
      const auto got = c.update(l, k, v);
      const auto want = r.update(l, k, v);
      ASSERT_EQ(got.first.sizes(), want.first.sizes()) << "step " << step << ": another window than the rolling cache's";
      const at::Tensor step_k = want.first.abs().amax(-1, true) / 127.0;  // each entry's quantization step
      EXPECT_TRUE(((got.first - want.first).abs() <= step_k * 0.5 + 1e-6).all().item<bool>());
    }
  }
  EXPECT_EQ(c.length(), r.length());
  // SPEC 7's formula per layer, 2 (K and V) x window x H x hd values, at 1 byte, plus a float scale
  // per (token, head) of each.
  EXPECT_EQ(c.bytes(), L * (2 * ctx * H * hd * 1 + 2 * ctx * H * 4));
  EXPECT_EQ(r.bytes(), L * 2 * ctx * H * hd * 4);
  // Row operations: a clone is independent, a rollback drops the newest entries.
  auto copy = c.clone();
  c.truncate(2);
  EXPECT_EQ(copy->stored(0).first.size(2), c.stored(0).first.size(2) + 2);
  EXPECT_TRUE(copy->stored(1).second.narrow(2, 0, c.stored(1).second.size(2)).equal(c.stored(1).second));
}

}  // namespace
}  // namespace tinygpt
