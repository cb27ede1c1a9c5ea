// GGUF export for llama.cpp's gptneox: every tensor read back equals the checkpoint's (the q/k row
// permutation undone), the metadata says what llama.cpp's loader needs, and the permutation keeps
// every q.k (so it changes no attention score). Zoo members: each goes to the architecture whose graph
// computes it, laid out as that graph reads it; a knob none carries is refused by name.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <map>

#include "tinygpt/errors.h"
#include "tinygpt/gguf.h"
#include "tinygpt/zoo.h"

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

// Halves -> adjacent for one head group, written out here on its own: new 2j = old j, new 2j+1 = old j + hd/2.
at::Tensor to_adjacent(const at::Tensor& w, int64_t heads, int64_t hd) {
  at::Tensor out = w.clone();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < hd / 2; ++j) {
      out[h * hd + 2 * j].copy_(w[h * hd + j]);
      out[h * hd + 2 * j + 1].copy_(w[h * hd + hd / 2 + j]);
    }
  return out;
}

struct Written {
  GgufFile file;
  std::map<std::string, at::Tensor> gguf, ours;
};

Written write_member(const std::string& name) {
  Config c = zoo_config(name);
  c.vocab_size = 64;
  GPT model(c, 7);
  at::NoGradGuard no_grad;
  for (auto& p : model->named_parameters())  // norms away from their identity, so a missing +1 shows
    if (p.key().find("norm") != std::string::npos) p.value().uniform_(-0.5, 0.5);
  const fs::path path = fs::temp_directory_path() / ("tinygpt-zoo-" + name + "-" + std::to_string(::getpid()) + ".gguf");
  write_gguf(path.string(), model, name);
  Written w{read_gguf(path.string()), {}, {}};
  fs::remove(path);
  w.gguf.insert(w.file.tensors.begin(), w.file.tensors.end());
  for (const auto& p : model->named_parameters()) w.ours[p.key()] = p.value().detach();
  return w;
}

TEST(Gguf, EachZooMemberGoesToTheArchitectureThatComputesIt) {
  const std::map<std::string, std::string> arch = {{"llama", "llama"}, {"mqa", "llama"},   {"mistral", "llama"},
                                                   {"gemma2", "gemma2"}, {"qwen3", "qwen3"}, {"neox", "gptneox"}};
  for (const auto& [name, want] : arch) {
    SCOPED_TRACE(name);
    const Config c = zoo_config(name);
    EXPECT_EQ(gguf_architecture(c), want);
    const Written w = write_member(name);
    const auto& md = w.file.metadata;
    ASSERT_EQ(md.at("general.architecture"), want);
    const std::string a = want + ".";
    EXPECT_EQ(md.at(a + "block_count"), std::to_string(c.n_layers));
    EXPECT_EQ(md.at(a + "feed_forward_length"), std::to_string(c.ffn_dim()));
    EXPECT_EQ(md.at(a + "attention.head_count"), std::to_string(c.n_heads));
    if (want != "gptneox") {
      EXPECT_EQ(md.at(a + "attention.head_count_kv"), std::to_string(c.kv_heads()));
      EXPECT_EQ(md.at(a + "attention.key_length"), std::to_string(c.head_dim()));
      EXPECT_EQ(w.gguf.at("blk.0.attn_k.weight").size(0), c.kv_heads() * c.head_dim());
    }
    EXPECT_EQ(w.gguf.count("output.weight"), c.tied_embeddings && want != "gptneox" ? 0u : 1u) << "tied: llama.cpp reads token_embd";
    EXPECT_EQ(md.count(a + "attention.sliding_window"), c.has_sliding() ? 1u : 0u);
  }
}

TEST(Gguf, LlamaRowsTurnAdjacentPairsAndItsScalingIsRopeFreqs) {
  const Config c = zoo_config("llama");
  const Written w = write_member("llama");
  const int64_t H = c.n_heads, G = c.kv_heads(), hd = c.head_dim();
  const at::Tensor qkv = w.ours.at("blocks.1.attn.qkv.weight");
  EXPECT_TRUE(w.gguf.at("blk.1.attn_q.weight").equal(to_adjacent(qkv.narrow(0, 0, H * hd), H, hd)));
  EXPECT_TRUE(w.gguf.at("blk.1.attn_k.weight").equal(to_adjacent(qkv.narrow(0, H * hd, G * hd), G, hd)));
  EXPECT_TRUE(w.gguf.at("blk.1.attn_v.weight").equal(qkv.narrow(0, (H + G) * hd, G * hd)));
  EXPECT_TRUE(w.gguf.at("output.weight").equal(w.ours.at("head.weight")));
  // llama3 from an original context of 128, factor 4, low 1, high 4: wavelengths under 128 / 4 keep
  // their frequency (factor 1), those over 128 / 1 are divided by 4; hd 24 has one of each at the ends.
  const at::Tensor f = w.gguf.at("rope_freqs.weight");
  ASSERT_EQ(f.numel(), hd / 2);
  EXPECT_FLOAT_EQ(f[0].item<float>(), 1.0f);
  EXPECT_NEAR(f[hd / 2 - 1].item<float>(), 4.0f, 1e-5);
  EXPECT_EQ(w.file.metadata.count("llama.rope.scaling.type"), 0u) << "the factors are the whole scaling";
}

TEST(Gguf, Gemma2NormsReadOnePlusWeightAndItsQueryScaleIsInQ) {
  const Config c = zoo_config("gemma2");
  const Written w = write_member("gemma2");
  EXPECT_TRUE(w.gguf.at("blk.2.attn_norm.weight").equal(w.ours.at("blocks.2.norm1.weight") + 1));
  EXPECT_TRUE(w.gguf.at("blk.2.post_ffw_norm.weight").equal(w.ours.at("blocks.2.post_mlp_norm.weight") + 1));
  EXPECT_TRUE(w.gguf.at("output_norm.weight").equal(w.ours.at("norm.weight") + 1));
  // llama.cpp scales q by head_dim^-0.5 (48); the model by query_pre_attn_scalar^-0.5 (64); Halves stay.
  const int64_t qrows = c.n_heads * c.head_dim();
  const at::Tensor q = w.ours.at("blocks.0.attn.qkv.weight").narrow(0, 0, qrows);
  EXPECT_LT((w.gguf.at("blk.0.attn_q.weight") - q * std::sqrt(48.0 / 64.0)).abs().max().item<float>(), 1e-7);
  EXPECT_EQ(w.file.metadata.at("gemma2.attn_logit_softcapping"), "20");
  EXPECT_EQ(w.file.metadata.at("gemma2.final_logit_softcapping"), "15");
  EXPECT_EQ(w.file.metadata.at("gemma2.attention.sliding_window"), "64");
}

TEST(Gguf, Qwen3KeepsItsHeadNormsAndYarn) {
  const Written w = write_member("qwen3");
  EXPECT_TRUE(w.gguf.at("blk.0.attn_q_norm.weight").equal(w.ours.at("blocks.0.attn.q_norm.weight")));
  EXPECT_EQ(w.file.metadata.at("qwen3.rope.scaling.type"), "yarn");
  EXPECT_EQ(w.file.metadata.at("qwen3.rope.scaling.factor"), "4");
  EXPECT_EQ(w.file.metadata.at("qwen3.rope.scaling.original_context_length"), "64");
  EXPECT_EQ(w.file.metadata.at("qwen3.rope.freq_base"), "1e+06");
}

TEST(Gguf, NeoxIsOneFusedQkvWithItsBiasesAndPartialRotary) {
  const Config c = zoo_config("neox");
  const Written w = write_member("neox");
  EXPECT_TRUE(w.gguf.at("blk.0.attn_qkv.weight").equal(w.ours.at("blocks.0.attn.qkv.weight"))) << "halves already: q | k | v as is";
  EXPECT_TRUE(w.gguf.at("blk.0.attn_qkv.bias").equal(w.ours.at("blocks.0.attn.qkv.bias")));
  EXPECT_EQ(w.file.metadata.at("gptneox.rope.dimension_count"), std::to_string(c.head_dim() / 4));
  EXPECT_EQ(w.file.metadata.at("gptneox.use_parallel_residual"), "true");
}

TEST(Gguf, AKnobNoArchitectureCarriesIsRefusedByName) {
  struct Case {
    std::string member, want;
    void (*edit)(Config&);
  };
  const std::vector<Case> cases = {
      {"gemma2", "attn_softcap = 0", [](Config& c) { c.attn_softcap = 0; }},
      {"gemma2", "layer_types", [](Config& c) { c.layer_types = {LayerKind::Full, LayerKind::Sliding, LayerKind::Full, LayerKind::Sliding}; }},
      {"neox", "n_kv_heads = 2", [](Config& c) { c.n_kv_heads = 2; }},
      {"qwen3", "rope_scaling llama3", [](Config& c) {
         c.rope_scaling = zoo_config("llama").rope_scaling;
       }},
      {"qwen3", "layer_types with sliding layers", [](Config& c) {
         c.layer_types.assign(3, LayerKind::Sliding);
         c.sliding_window = 8;
       }},
      {"mqa", "partial_rotary", [](Config& c) { c.partial_rotary = 0.5; }},
      {"mqa", "parallel_residual", [](Config& c) { c.parallel_residual = true; }},
  };
  for (const auto& k : cases) {
    Config c = zoo_config(k.member);
    k.edit(c);
    c.validate();
    try {
      gguf_architecture(c);
      ADD_FAILURE() << k.member << ": accepted " << k.want;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(k.want), std::string::npos) << e.what();
    }
  }
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
