// The GPT's structure against SPEC 1: parameter count, state-dict names and shapes, tied head,
// initialisation scale, and the untrained loss.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "tinygpt/gpt.h"
#include "tinygpt/kernel_step.h"

namespace tinygpt {
namespace {

TEST(Model, DefaultConfigHas5781504Parameters) {
  GPT model(Config{}, 0);
  EXPECT_EQ(model->parameter_count(), 5781504);
}

TEST(Model, StateDictMatchesTheSeriesNamesAndShapes) {
  Config cfg;
  GPT model(cfg, 0);
  auto sd = model->state_dict();
  ASSERT_EQ(sd.size(), 64u);
  std::map<std::string, std::vector<int64_t>> expected = {
      {"emb.weight", {4096, 256}}, {"norm.weight", {256}}, {"norm.bias", {256}}, {"head.weight", {4096, 256}}};
  for (int i = 0; i < 6; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    expected[p + "norm1.weight"] = {256};
    expected[p + "norm1.bias"] = {256};
    expected[p + "norm2.weight"] = {256};
    expected[p + "norm2.bias"] = {256};
    expected[p + "attn.qkv.weight"] = {768, 256};
    expected[p + "attn.out.weight"] = {256, 256};
    expected[p + "mlp.0.weight"] = {1024, 256};
    expected[p + "mlp.0.bias"] = {1024};
    expected[p + "mlp.2.weight"] = {256, 1024};
    expected[p + "mlp.2.bias"] = {256};
  }
  std::map<std::string, at::Tensor> got(sd.begin(), sd.end());
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(got.count(name)) << "missing " << name;
    EXPECT_EQ(got[name].sizes().vec(), shape) << name;
    EXPECT_EQ(got[name].scalar_type(), at::kFloat) << name;
  }
  EXPECT_EQ(got["head.weight"].data_ptr(), got["emb.weight"].data_ptr()) << "head must share emb's storage";
}

TEST(Model, InitialisationFollowsTheSeries) {
  GPT model(Config{}, 7);
  auto sd = model->state_dict();
  std::map<std::string, at::Tensor> t(sd.begin(), sd.end());
  const double resid = 0.02 / std::sqrt(12.0);
  EXPECT_NEAR(t["emb.weight"].std().item<double>(), 0.02, 0.0005);
  EXPECT_NEAR(t["blocks.0.attn.qkv.weight"].std().item<double>(), 0.02, 0.0005);
  EXPECT_NEAR(t["blocks.3.mlp.0.weight"].std().item<double>(), 0.02, 0.0005);
  EXPECT_NEAR(t["blocks.0.attn.out.weight"].std().item<double>(), resid, 0.0005);
  EXPECT_NEAR(t["blocks.5.mlp.2.weight"].std().item<double>(), resid, 0.0005);
  EXPECT_EQ(t["blocks.2.mlp.0.bias"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(t["blocks.2.norm1.weight"].min().item<double>(), 1.0);
  // Same seed, same weights, whatever the global generator holds; another seed, other weights.
  at::manual_seed(12345);
  GPT again(Config{}, 7), other(Config{}, 8);
  auto sa = again->state_dict(), so = other->state_dict();
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_TRUE(sa[i].second.equal(sd[i].second)) << sd[i].first;
    if (sd[i].first.find("weight") != std::string::npos && sd[i].first.find("norm") == std::string::npos) {
      EXPECT_FALSE(so[i].second.equal(sd[i].second)) << sd[i].first;
    }
  }
}

TEST(Model, UntrainedLossOnRandomTokensIsLnVocab) {
  GPT model(Config{}, 0);
  model->eval();
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(123);
  at::Tensor idx = at::randint(4096, {4, 129}, gen, at::kLong);  // (4, 129)
  at::Tensor logits = model->forward(idx.narrow(1, 0, 128));       // (4, 128, V)
  at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, 4096}), idx.narrow(1, 1, 128).reshape({-1}));
  EXPECT_NEAR(loss.item<double>(), std::log(4096.0), 0.1);
}

// The uncached loop's forward: the head over the last row only. Same function as forward's last
// row (the bound allows a BLAS to round a one-row product differently from a many-row one), and not
// some other row of it.
TEST(Model, ForwardLastIsForwardsLastRow) {
  GPT model(Config{}, 3);
  model->eval();
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(5);
  for (int64_t T : {1, 3, 100, 256}) {
    const at::Tensor idx = at::randint(4096, {2, T}, gen, at::kLong);  // (2, T)
    const at::Tensor full = model->forward(idx);                      // (2, T, V)
    const at::Tensor last = model->forward_last(idx);                 // (2, V)
    ASSERT_EQ(last.sizes(), (std::vector<int64_t>{2, 4096}));
    EXPECT_LT((last - full.select(1, T - 1)).abs().max().item<double>(), 1e-6) << T;
    if (T > 1) {
      EXPECT_GT((last - full.select(1, T - 2)).abs().max().item<double>(), 1e-2) << T;
    }
  }
  EXPECT_THROW(model->forward_last(at::zeros({1, 257}, at::kLong)), std::invalid_argument);
  EXPECT_THROW(model->forward_last(at::tensor({1, 4096}, at::kLong).unsqueeze(0)), std::invalid_argument);
}

// pack_parameters (kernel_step.h) puts every parameter in one block, in the order a decode step
// reads them, so the step streams one run of memory; the tied head (the embedding) comes last. The
// values move with them: the model computes bitwise what it computed before. The plain model is
// left where LibTorch put it; a loaded checkpoint is packed (model_from_checkpoint).
TEST(Model, PackedParametersLiveInOneBlockInTheOrderAStepReadsThem) {
  GPT model(Config{}, 0);
  model->eval();
  at::NoGradGuard no_grad;
  const at::Tensor idx = at::arange(40, at::kLong).view({2, 20}) * 97 % 4096;  // (2, 20)
  const at::Tensor before = model->forward(idx);                              // (2, 20, V)
  pack_parameters(*model);
  std::vector<const float*> order;
  for (const auto& m : *model->blocks) {
    auto* b = m->as<BlockImpl>();
    for (const at::Tensor& t : {b->norm1->weight, b->attn->qkv->weight, b->attn->out->weight, b->norm2->weight, b->up->weight,
                                b->down->weight})
      order.push_back(t.data_ptr<float>());
  }
  order.push_back(model->norm->weight.data_ptr<float>());
  order.push_back(model->emb->weight.data_ptr<float>());
  for (size_t i = 1; i < order.size(); ++i) EXPECT_LT(order[i - 1], order[i]) << i;
  const float* first = order.front();
  const float* end = order.back() + model->emb->weight.numel();
  EXPECT_LT(end - first, model->parameter_count() + 16 * 64) << "one block, 64-byte aligned slots";
  for (const auto& p : model->parameters()) EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data_ptr()) % 64, 0u);
  EXPECT_TRUE(model->forward(idx).equal(before));
  const auto sd = model->state_dict();
  const auto head = std::find_if(sd.begin(), sd.end(), [](const auto& e) { return e.first == "head.weight"; });
  ASSERT_NE(head, sd.end());
  EXPECT_EQ(head->second.data_ptr(), model->emb->weight.data_ptr()) << "the head stays tied";
}

TEST(Model, RejectsBadTokenIds) {
  GPT model(Config{}, 0);
  EXPECT_THROW(model->forward(at::tensor({1, 4096}, at::kLong).unsqueeze(0)), std::invalid_argument);
  EXPECT_THROW(model->forward(at::tensor({-1}, at::kLong).unsqueeze(0)), std::invalid_argument);
  EXPECT_THROW(model->forward(at::tensor({1, 2}, at::kLong)), std::invalid_argument);  // 1-D
  EXPECT_THROW(model->forward(at::tensor({1, 2}, at::kInt).unsqueeze(0)), std::invalid_argument);
  EXPECT_THROW(model->forward(at::zeros({1, 257}, at::kLong)), std::invalid_argument);  // > context
}

}  // namespace
}  // namespace tinygpt
