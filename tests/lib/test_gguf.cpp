// GGUF export for llama.cpp's gptneox: every tensor read back equals the checkpoint's (the q/k row
// permutation undone), the metadata says what llama.cpp's loader needs, and the permutation keeps
// every q.k (so it changes no attention score).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <map>

#include "tinygpt/errors.h"
#include "tinygpt/gguf.h"

namespace tinygpt {
namespace {

namespace fs = std::filesystem;

TEST(Gguf, EveryTensorReadsBackAsTheCheckpointHasIt) {
  Config c;
  c.vocab_size = 64;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.context = 16;
  GPT model(c, 5);
  const fs::path p = fs::temp_directory_path() / ("tinygpt-gguf-" + std::to_string(::getpid()) + ".gguf");
  write_gguf(p.string(), model, "test");
  const GgufFile f = read_gguf(p.string());
  fs::remove(p);
  EXPECT_EQ(f.version, 3u);
  const std::map<std::string, std::string> want = {
      {"general.architecture", "gptneox"}, {"gptneox.context_length", "16"}, {"gptneox.embedding_length", "32"},
      {"gptneox.block_count", "2"}, {"gptneox.feed_forward_length", "128"}, {"gptneox.rope.dimension_count", "8"},
      {"gptneox.rope.freq_base", "10000"}, {"gptneox.attention.head_count", "4"}, {"gptneox.use_parallel_residual", "false"},
      {"gptneox.attention.layer_norm_epsilon", "1e-05"}, {"gptneox.vocab_size", "64"}, {"tokenizer.ggml.model", "none"},
      {"general.file_type", "0"}};
  for (const auto& [k, v] : want) {
    ASSERT_TRUE(f.metadata.count(k)) << k;
    EXPECT_EQ(f.metadata.at(k), v) << k;
  }
  std::map<std::string, at::Tensor> got(f.tensors.begin(), f.tensors.end());
  EXPECT_EQ(got.size(), 4u + 12u * 2u);
  const auto sd = model->state_dict();
  std::map<std::string, at::Tensor> ours(sd.begin(), sd.end());
  auto same = [&](const std::string& gguf, const at::Tensor& want) {
    ASSERT_TRUE(got.count(gguf)) << gguf;
    EXPECT_TRUE(got.at(gguf).equal(want.detach())) << gguf;
  };
  same("token_embd.weight", ours.at("emb.weight"));
  same("output.weight", ours.at("emb.weight"));
  same("output_norm.weight", ours.at("norm.weight"));
  same("output_norm.bias", ours.at("norm.bias"));
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", o = "blocks." + std::to_string(i) + ".";
    same(b + "attn_norm.weight", ours.at(o + "norm1.weight"));
    same(b + "ffn_norm.bias", ours.at(o + "norm2.bias"));
    same(b + "attn_output.weight", ours.at(o + "attn.out.weight"));
    same(b + "ffn_up.weight", ours.at(o + "mlp.0.weight"));
    same(b + "ffn_up.bias", ours.at(o + "mlp.0.bias"));
    same(b + "ffn_down.weight", ours.at(o + "mlp.2.weight"));
    same(b + "ffn_down.bias", ours.at(o + "mlp.2.bias"));
    EXPECT_EQ(got.at(b + "attn_qkv.bias").abs().max().item<float>(), 0.0f);
    EXPECT_EQ(got.at(b + "attn_output.bias").abs().max().item<float>(), 0.0f);
    const at::Tensor qkv = ours.at(o + "attn.qkv.weight").detach();
    EXPECT_FALSE(got.at(b + "attn_qkv.weight").equal(qkv)) << "q and k rows are permuted";
    EXPECT_TRUE(permute_qk_rows(got.at(b + "attn_qkv.weight"), 4, /*inverse=*/true).equal(qkv)) << "undone, they are ours";
    EXPECT_TRUE(got.at(b + "attn_qkv.weight").narrow(0, 64, 32).equal(qkv.narrow(0, 64, 32))) << "v rows unchanged";
  }
}

// The permutation maps our interleaved pairs (2j, 2j+1) to NeoX's halves (j, j + hd/2), on q and k
// alike: every dot product of a q row with a k row survives it.
TEST(Gguf, ThePermutationKeepsEveryQueryKeyProduct) {
  at::Generator g = at::detail::createCPUGenerator(3);
  const at::Tensor w = at::randn({3 * 32, 32}, g).to(at::kDouble), x = at::randn({5, 32}, g).to(at::kDouble);
  const at::Tensor p = permute_qk_rows(w, 4);
  auto qk = [&](const at::Tensor& m) {
    const at::Tensor y = at::matmul(x, m.t());  // (5, 96)
    return at::matmul(y.narrow(1, 0, 32).view({5, 4, 8}).transpose(0, 1), y.narrow(1, 32, 32).view({5, 4, 8}).permute({1, 2, 0}));
  };
  EXPECT_LT((qk(w) - qk(p)).abs().max().item<double>(), 1e-10) << "the same sums in another order, in double";
  EXPECT_TRUE(p.narrow(0, 0, 8).narrow(0, 0, 1).equal(w.narrow(0, 0, 1)));  // head 0: new row 0 = old row 0
  EXPECT_TRUE(p.narrow(0, 1, 1).equal(w.narrow(0, 2, 1)));                  // new row 1 = old row 2
  EXPECT_TRUE(p.narrow(0, 4, 1).equal(w.narrow(0, 1, 1)));                  // new row hd/2 = old row 1
}

TEST(Gguf, AFileThatIsNotGgufIsNamed) {
  const fs::path p = fs::temp_directory_path() / ("tinygpt-not-gguf-" + std::to_string(::getpid()));
  { std::ofstream(p) << "GGML but not quite"; }
  try {
    read_gguf(p.string());
    FAIL() << "read a file that is not GGUF";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  fs::remove(p);
}

}  // namespace
}  // namespace tinygpt
