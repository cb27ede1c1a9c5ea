// The decode kernels (Kernels::Decode) against LibTorch's ops on the same inputs: the weight
// products with their fused epilogues, LayerNorm, and the one-query attention. The model-level
// proof is the equivalence harness; these pin each kernel down alone, on awkward shapes too.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "kernel_paths.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "tinygpt/blas.h"
#include "tinygpt/huge_pages.h"
#include "tinygpt/kernels.h"

namespace tinygpt {
namespace {

class Matvec : public OnEveryKernelPath {};
class DecodeGelu : public OnEveryKernelPath {};
class DecodeLayerNorm : public OnEveryKernelPath {};
class DecodeAttention : public OnEveryKernelPath {};

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Rows 1..17 (input rows go in groups of three, then two or one) and sizes that are not multiples
// of the kernel's blocks (N % 4, K % 8) take the tails.
TEST_P(Matvec, EqualsLinearOnEveryBlockingCase) {
  for (int64_t R : {1, 2, 3, 4, 5, 16, 17})
    for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{768, 256}, {7, 13}, {1, 8}, {4099, 24}}) {
      at::Tensor x = randn({R, K}, 1), w = randn({N, K}, 2), b = randn({N}, 3);
      EXPECT_LT(max_diff(matvec(x, w, b), at::linear(x, w, b)), 1e-4) << R << " " << N << "x" << K;
      EXPECT_LT(max_diff(matvec(x, w, {}), at::linear(x, w)), 1e-4) << R << " " << N << "x" << K;
    }
}

// A row's result must not depend on the rows beside it: whether it is computed in a group of
// three, two or alone, with one thread or two, it is the same sum in the same order, bit for bit.
// The batch checks rely on it (a batch row against the same prompt alone).
TEST_P(Matvec, EachRowIsTheSameSumWhateverTheBatch) {
  const int threads = at::get_num_threads();
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{768, 256}, {257, 1024}}) {
    const at::Tensor x = randn({16, K}, 20), w = randn({N, K}, 21), b = randn({N}, 22);
    for (int t : {1, 2}) {
      at::set_num_threads(t);
      const at::Tensor all = matvec(x, w, b);  // (16, N)
      for (int64_t R : {1, 2, 3, 4, 5})
        for (int64_t r0 = 0; r0 + R <= 16; r0 += 4)
          EXPECT_TRUE(matvec(x.narrow(0, r0, R), w, b).equal(all.narrow(0, r0, R)))
              << "rows " << r0 << ".." << r0 + R - 1 << " of " << N << "x" << K << ", " << t << " threads";
    }
  }
  at::set_num_threads(threads);
}

TEST_P(Matvec, ProjectFusesBiasGeluAndResidualInTheLibraryOrder) {
  at::Tensor x = randn({2, 1, 256}, 4), w = randn({1024, 256}, 5), b = randn({1024}, 6), res = randn({2, 1, 1024}, 7);
  const at::Tensor want = res + at::gelu(at::linear(x, w, b));
  const at::Tensor got = project(x, w, b, Kernels::Decode, res, /*gelu=*/true);
  EXPECT_EQ(got.sizes(), want.sizes());
  EXPECT_LT(max_diff(got, want), 1e-4);
  // Bias, then GELU, then the residual: exactly that order, not within a tolerance.
  EXPECT_TRUE(got.equal(res + decode_gelu(matvec(x.view({2, 256}), w, b)).view({2, 1, 1024})));
  // Library is LibTorch's ops exactly. Two runs of the same LibTorch product are bitwise equal on
  // one thread; on more, OpenBLAS's older kernels (Prescott: what 0.3.21 picks on CPUs newer than it)
  // split a small product's sums between threads differently from run to run, and LibTorch promises
  // no more than that. So: the bits on one thread, and on two the summation-order bound of a
  // 256-term dot product of unit normals: about sqrt(K) u sum|x w| = 16 x 6e-8 x 160 = 1.5e-4
  // (OPENBLAS_CORETYPE=Prescott here: 2.3e-5; Haswell, SkylakeX and Zen kernels gave the same bits).
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor want1 = res + at::gelu(at::linear(x, w, b));
  EXPECT_TRUE(project(x, w, b, Kernels::Library, res, true).equal(want1)) << "Library is LibTorch's ops exactly";
  at::set_num_threads(2);
  EXPECT_LT(max_diff(project(x, w, b, Kernels::Library, res, true), want1), 1e-4);
  at::set_num_threads(threads);
}

TEST(KernelPaths, TheWidestTheCpuRunsIsInForceAndAnUnknownNameIsRefused) {
  const auto available = kernel_paths_available();
  ASSERT_FALSE(available.empty());
  EXPECT_EQ(available.front(), KernelPath::Portable) << "every CPU runs the portable path";
  EXPECT_THROW(kernel_path_from_string("avx9"), std::invalid_argument);
  EXPECT_EQ(kernel_path_from_string("portable"), KernelPath::Portable);
  EXPECT_EQ(kernel_path_from_string(to_string(KernelPath::Avx2)), KernelPath::Avx2);
  const KernelPath was = kernel_path();
  for (KernelPath p : available) {
    set_kernel_path(p);
    EXPECT_EQ(kernel_path(), p);
  }
  set_kernel_path(was);
  if (available.size() == 1) {
    EXPECT_THROW(set_kernel_path(KernelPath::Avx2), std::invalid_argument);
  }
}

// Decode's GELU against the exact erf form in double precision, and beside LibTorch's own. Its erf is
// Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, the formula of LibTorch's vector GELU), computed
// in float, so the bound is x / 2 times that error plus the rounding of 1 - r t e and of 1 + erf
// (one ulp of 1, where x < 0 cancels them), plus a few roundings of the result. (at::gelu's own
// vector path stays within the same bound.) Widths that are not whole vectors take the masked
// tail; specials keep their IEEE meaning.
TEST_P(DecodeGelu, IsTheErfFormWithinItsErrorBound) {
  for (int64_t n : {4001, 8, 5, 1}) {
    const at::Tensor x = at::linspace(-12.0, 12.0, n, at::kFloat);
    const at::Tensor got = decode_gelu(x).to(at::kDouble), xd = x.to(at::kDouble);
    const at::Tensor exact = xd * 0.5 * (1 + at::erf(xd / std::sqrt(2.0)));
    const at::Tensor ulp = exact.abs() * std::ldexp(1.0, -23);  // one float ulp of the result, at most
    const at::Tensor bound = xd.abs() * 0.5 * (1.5e-7 + std::ldexp(1.0, -23)) + 4 * ulp + 1e-30;
    const at::Tensor over = (got - exact).abs() > bound;
    EXPECT_EQ(over.sum().item<int64_t>(), 0) << "width " << n << ": worst error " << (got - exact).abs().max().item<double>();
    if (n > 100) {
      EXPECT_LT(max_diff(decode_gelu(x), at::gelu(x)), 1e-6) << "against LibTorch's at::gelu";
      EXPECT_EQ(decode_gelu(x.view({1, n})).sizes(), x.view({1, n}).sizes());
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  const at::Tensor specials = at::tensor({0.0f, -0.0f, inf, -inf, std::nanf(""), 100.0f, -100.0f});
  const at::Tensor g = decode_gelu(specials), want = at::gelu(specials);
  EXPECT_EQ(g[0].item<float>(), 0.0f);
  EXPECT_EQ(g[2].item<float>(), inf);
  EXPECT_TRUE(std::isnan(g[3].item<float>())) << "-inf * 0.5 * (1 + erf(-inf)) = -inf * 0, as at::gelu: " << want[3].item<float>();
  EXPECT_TRUE(std::isnan(g[4].item<float>()));
  EXPECT_EQ(g[5].item<float>(), 100.0f);
  EXPECT_EQ(g[6].item<float>(), -0.0f);
  EXPECT_THROW(decode_gelu(specials.to(at::kDouble)), std::invalid_argument);
}

// GELU rows, too, must not depend on the rows beside them (ATen computes a one-element tensor with
// its scalar formula): a row alone and in batches up to 16, on widths that are and are not whole
// vector chunks, one included.
TEST_P(Matvec, GeluRowIsTheSameWhateverTheBatch) {
  for (int64_t N : {1024, 20, 100, 1}) {
    const at::Tensor x = randn({16, 64}, 40), w = randn({N, 64}, 41), b = randn({N}, 42);
    const at::Tensor all = project(x, w, b, Kernels::Decode, {}, /*gelu=*/true);  // (16, N)
    for (int64_t R : {1, 3, 5})
      for (int64_t r0 = 0; r0 + R <= 16; r0 += 5)
        EXPECT_TRUE(project(x.narrow(0, r0, R), w, b, Kernels::Decode, {}, true).equal(all.narrow(0, r0, R)))
            << "rows " << r0 << ".." << r0 + R - 1 << " of width " << N;
  }
}

// Where the model keeps its weights and the static cache its keys: a huge-page block from 2 MiB on,
// ordinary 64-byte aligned memory below, n floats either way, usable as any tensor.
TEST(HugePages, BlocksAreAlignedToWhatTheyAreFor) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 19, (int64_t{1} << 20) + 3}) {
    at::Tensor t = huge_page_floats(n);
    EXPECT_EQ(t.numel(), n);
    const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr<float>());
    EXPECT_EQ(addr % (n * 4 >= (int64_t{2} << 20) ? (uintptr_t{2} << 20) : 64), 0u) << n;
    t.fill_(2.0f);
    EXPECT_EQ(t.sum().item<double>(), 2.0 * static_cast<double>(n));
  }
}

TEST_P(Matvec, ManyRowsGoToTheLibrary) {
  at::Tensor x = randn({kMatvecBlockedMaxRows + 1, 64}, 8), w = randn({32, 64}, 9);
  EXPECT_TRUE(project(x, w, {}, Kernels::Decode).equal(at::linear(x, w)));
}

// Past kMatvecMaxRows and up to kMatvecBlockedMaxRows rows (a batch's verify step) the kernel runs
// block by block: every row is the sum it is alone, bit for bit, bias, GELU and residual included.
TEST_P(Matvec, ABlockedProductIsEachRowAlone) {
  for (int64_t R : {kMatvecMaxRows + 1, int64_t{36}, kMatvecBlockedMaxRows}) {
    const at::Tensor x = randn({R, 256}, 50), w = randn({96, 256}, 51), b = randn({96}, 52), res = randn({R, 96}, 53);
    const at::Tensor all = project(x, w, b, Kernels::Decode, res, /*gelu=*/true);  // (R, 96)
    EXPECT_LT(max_diff(all, res + at::gelu(at::linear(x, w, b))), 1e-4) << R << " rows";
    for (int64_t r = 0; r < R; r += 7)
      EXPECT_TRUE(project(x.narrow(0, r, 1), w, b, Kernels::Decode, res.narrow(0, r, 1), true).equal(all.narrow(0, r, 1)))
          << "row " << r << " of " << R;
  }
}

TEST_P(Matvec, RejectsBadShapes) {
  EXPECT_THROW(matvec(randn({2, 8}, 1), randn({4, 9}, 1), {}), std::invalid_argument);
  EXPECT_THROW(matvec(randn({2, 8}, 1), randn({4, 8}, 1), randn({5}, 1)), std::invalid_argument);
  EXPECT_THROW(matvec(randn({2, 8}, 1).to(at::kDouble), randn({4, 8}, 1), {}), std::invalid_argument);
}

TEST_P(DecodeLayerNorm, EqualsLibTorch) {
  at::Tensor x = randn({3, 1, 256}, 10) * 4 + 1, w = randn({256}, 11), b = randn({256}, 12);
  EXPECT_LT(max_diff(layer_norm(x, w, b, 1e-5, Kernels::Decode), at::layer_norm(x, {256}, w, b, 1e-5)), 1e-5);
  EXPECT_TRUE(layer_norm(x, w, b, 1e-5, Kernels::Library).equal(at::layer_norm(x, {256}, w, b, 1e-5)));
}

// Up to kMatvecBlockedMaxRows rows (a prefill or a batch's verify step) each row is normalised as it is
// alone, bit for bit; past that, LibTorch's.
TEST_P(DecodeLayerNorm, EachRowIsTheSameWhateverTheRowsBesideIt) {
  const at::Tensor w = randn({256}, 11), b = randn({256}, 12);
  const at::Tensor x = randn({kMatvecBlockedMaxRows, 256}, 13) * 4 + 1;
  const at::Tensor all = layer_norm(x, w, b, 1e-5, Kernels::Decode);
  EXPECT_LT(max_diff(all, at::layer_norm(x, {256}, w, b, 1e-5)), 1e-5);
  for (int64_t r = 0; r < kMatvecBlockedMaxRows; r += 9)
    EXPECT_TRUE(layer_norm(x.narrow(0, r, 1), w, b, 1e-5, Kernels::Decode).equal(all.narrow(0, r, 1))) << "row " << r;
  const at::Tensor more = randn({kMatvecBlockedMaxRows + 1, 256}, 14);
  EXPECT_TRUE(layer_norm(more, w, b, 1e-5, Kernels::Decode).equal(at::layer_norm(more, {256}, w, b, 1e-5)));
}

// The attention of one query over cached keys, from strided views as a preallocated cache hands
// them out (a slice of a longer buffer).
TEST_P(DecodeAttention, EqualsMatmulSoftmaxOnBufferViews) {
  at::Tensor q = randn({2, 4, 1, 64}, 13);
  at::Tensor kbuf = randn({2, 4, 600, 64}, 14), vbuf = randn({2, 4, 600, 64}, 15);
  for (int64_t S : {1, 7, 257}) {
    at::Tensor K = kbuf.narrow(2, 100, S), V = vbuf.narrow(2, 100, S);
    const at::Tensor want = at::matmul(at::softmax(at::matmul(q, K.transpose(-2, -1)) / 8.0, -1), V);
    EXPECT_LT(max_diff(decode_attention(q, K, V), want), 1e-5) << S;
    EXPECT_LT(max_diff(attend(q, K, V, {}, Kernels::Decode), want), 1e-5) << S;
    EXPECT_TRUE(attend(q, K, V, {}, Kernels::Library).equal(want)) << S;
  }
}

// Head sizes off the vector path (not a multiple of 8, or past the register budget) take the
// portable row, and one that fits takes the vector row; both equal the reference.
TEST_P(DecodeAttention, EveryHeadSizeEqualsMatmulSoftmax) {
  for (int64_t hd : {4, 8, 12, 32, 64, 128, 136}) {
    at::Tensor q = randn({3, 2, 1, hd}, 20 + hd), K = randn({3, 2, 9, hd}, 21 + hd), V = randn({3, 2, 9, hd}, 22 + hd);
    const at::Tensor want =
        at::matmul(at::softmax(at::matmul(q, K.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd)), -1), V);
    EXPECT_LT(max_diff(decode_attention(q, K, V), want), 1e-5) << hd;
  }
}

// A mask (a fault policy's, say) always takes LibTorch's path, so it is honoured.
TEST_P(DecodeAttention, AMaskTakesTheLibraryPath) {
  at::Tensor q = randn({1, 4, 1, 64}, 16), K = randn({1, 4, 9, 64}, 17), V = randn({1, 4, 9, 64}, 18);
  at::Tensor mask = at::zeros({1, 9});
  mask.narrow(1, 1, 8).fill_(-INFINITY);
  at::Tensor got = attend(q, K, V, mask, Kernels::Decode);
  EXPECT_LT(max_diff(got, V.narrow(2, 0, 1)), 1e-6) << "only key 0 is visible";
}

TEST_P(DecodeAttention, RejectsTwoQueries) {
  EXPECT_THROW(decode_attention(randn({1, 4, 2, 64}, 1), randn({1, 4, 5, 64}, 2), randn({1, 4, 5, 64}, 3)),
               std::invalid_argument);
}

TINYGPT_ON_EVERY_KERNEL_PATH(Matvec);
TINYGPT_ON_EVERY_KERNEL_PATH(DecodeGelu);
TINYGPT_ON_EVERY_KERNEL_PATH(DecodeLayerNorm);
TINYGPT_ON_EVERY_KERNEL_PATH(DecodeAttention);

// The BLAS core a fallback is replaced by: the widest the CPU runs, of the CPU's own vendor where
// OpenBLAS has one; a core that already fits (or one this does not know) is kept.
TEST(BlasCore, AFallbackOlderThanTheCpuIsReplacedByTheCoreThatMatchesIt) {
  CpuFeatures intel512{"GenuineIntel", true, true, true, true, true, true, true};
  CpuFeatures amd2{"AuthenticAMD", true, true, true, true, true, true, false};
  CpuFeatures old{"GenuineIntel", true, true, false, false, false, false, false};
  EXPECT_EQ(better_blas_core("Prescott", intel512), "SkylakeX");
  EXPECT_EQ(better_blas_core("Prescott", amd2), "Zen");
  EXPECT_EQ(better_blas_core("Haswell", intel512), "SkylakeX");
  EXPECT_EQ(better_blas_core("Zen", amd2), "") << "a core that fits stands";
  EXPECT_EQ(better_blas_core("SkylakeX", intel512), "");
  EXPECT_EQ(better_blas_core("Core2", old), "") << "an SSSE3 CPU has nothing wider";
  EXPECT_EQ(better_blas_core("SomeArmCore", amd2), "") << "an unknown core is not second-guessed";
  EXPECT_TRUE(blas_core_runs_on("prescott", old));
  EXPECT_FALSE(blas_core_runs_on("Haswell", old));
  EXPECT_FALSE(blas_core_runs_on("SkylakeX", amd2)) << "AVX-512 kernels on an AVX2 CPU would fault";
  EXPECT_FALSE(blas_core_runs_on("Foo", intel512));
}

}  // namespace
}  // namespace tinygpt
