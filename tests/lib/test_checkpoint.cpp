// Interop with the series' own files (label interop): Debian's python3-torch writes checkpoints
// exactly as the series' trainer does, and an independent Python implementation of SPEC 1-4
// (tests/interop/series_reference.py) computes the logits and greedy ids we must reproduce.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "paths.h"
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tinygpt/torch_checkpoint.h"
#include "tinygpt/checkpoint.h"
#include "tinygpt/generate.h"

namespace tinygpt {
namespace {

namespace fs = std::filesystem;

class Interop : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(TINYGPT_BINARY_DIR) / "interop";
    if (fs::exists(dir_ / "expected.json")) return;
    const std::string cmd = "/usr/bin/python3 " + std::string(TINYGPT_SOURCE_DIR) +
                            "/tests/interop/series_reference.py " + dir_.string() + " > /dev/null 2>&1";
    ok_ = std::system(cmd.c_str()) == 0;
  }
  void SetUp() override {
    if (!fs::exists(dir_ / "expected.json"))
      GTEST_SKIP() << "python3-torch could not write the reference files (install it with ci/install.sh)";
    std::ifstream in(dir_ / "expected.json");
    expected_ = nlohmann::json::parse(in);
  }
  static fs::path dir_;
  static bool ok_;
  nlohmann::json expected_;
};
fs::path Interop::dir_;
bool Interop::ok_ = false;

TEST_F(Interop, ReadsEveryTensorBitExactly) {
  Checkpoint ck = read_torch_checkpoint((dir_ / "series.pt").string());
  EXPECT_EQ(ck.step, 1500);
  EXPECT_EQ(ck.config, Config{});
  ASSERT_EQ(ck.tensors.size(), 64u);
  std::ifstream raw(dir_ / "series.bin", std::ios::binary);
  const auto names = expected_["names"].get<std::vector<std::string>>();
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_EQ(ck.tensors[i].first, names[i]);
    at::Tensor t = ck.tensors[i].second.contiguous();
    std::vector<char> want(t.numel() * 4);
    raw.read(want.data(), static_cast<std::streamsize>(want.size()));
    EXPECT_EQ(std::memcmp(want.data(), t.data_ptr(), want.size()), 0) << names[i];
  }
  // The tied head is one storage in the file, so one tensor here.
  EXPECT_EQ(ck.tensors.back().first, "head.weight");
  EXPECT_EQ(ck.tensors.back().second.data_ptr(), ck.tensors.front().second.data_ptr());
}

TEST_F(Interop, LogitsAndGreedyIdsMatchPyTorch) {
  GPT model = load_checkpoint((dir_ / "series.pt").string(), at::kCPU);
  at::NoGradGuard no_grad;
  for (const auto& p : expected_["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int64_t>>();
    at::Tensor prompt = at::tensor(ids, at::kLong).unsqueeze(0);
    at::Tensor want = at::tensor(p["last_logits"].get<std::vector<float>>());
    at::Tensor got = model->forward(prompt)[0][-1];
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-5);
    RollingKVCache cache(model->config());
    at::Tensor un = generate_uncached(model, prompt, 300, greedy())[0];
    at::Tensor ca = generate_cached(model, prompt, 300, greedy(), cache)[0];
    EXPECT_TRUE(un.equal(at::tensor(p["uncached"].get<std::vector<int64_t>>(), at::kLong)));
    EXPECT_TRUE(ca.equal(at::tensor(p["cached"].get<std::vector<int64_t>>(), at::kLong)));
  }
}

TEST_F(Interop, HalfPrecisionCheckpointIsConvertedAndSaidSo) {
  std::vector<std::string> notes;
  GPT model = load_checkpoint((dir_ / "series_f16.pt").string(), at::kCPU, &notes);
  EXPECT_EQ(notes.size(), 64u);  // every state-dict entry, the tied head included
  EXPECT_NE(notes.front().find("converted Half to float32"), std::string::npos) << notes.front();
  Checkpoint full = read_torch_checkpoint((dir_ / "series.pt").string());
  EXPECT_LT((model->emb->weight - full.tensors.front().second).abs().max().item<double>(), 1e-3);
}

TEST_F(Interop, RefusesAPickleNamingAnyOtherGlobal) {
  try {
    read_torch_checkpoint((dir_ / "evil.pt").string());
    FAIL() << "loaded a checkpoint that names os.system";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("refused global 'posix.system'"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, RefusesAFileThatIsNotAZip) {
  const auto path = fs::temp_directory_path() / "tinygpt_not_a_zip.pt";
  std::ofstream(path) << "hello";
  EXPECT_THROW(read_torch_checkpoint(path.string()), std::runtime_error);
  EXPECT_THROW(read_torch_checkpoint("/nonexistent/file.pt"), std::runtime_error);
}

// Weight validation on in-memory state dicts: one clear message per problem.
class Weights : public ::testing::Test {
 protected:
  void expect_refused(const std::vector<std::pair<std::string, at::Tensor>>& sd, const std::string& word) {
    GPT m(Config{}, 1);
    at::Tensor before = m->emb->weight.clone();
    try {
      load_weights(m, sd);
      FAIL() << "accepted; expected an error about " << word;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
    EXPECT_TRUE(m->emb->weight.equal(before)) << "the model must be untouched on error";
  }
  std::vector<std::pair<std::string, at::Tensor>> good() {
    std::vector<std::pair<std::string, at::Tensor>> sd;
    for (auto& [n, t] : src->state_dict()) sd.emplace_back(n, t.detach().clone());
    sd.back().second = sd.front().second;  // tied
    return sd;
  }
  GPT src{Config{}, 0};
};

TEST_F(Weights, LoadsAGoodStateDict) {
  GPT m(Config{}, 1);
  load_weights(m, good());
  EXPECT_TRUE(m->emb->weight.equal(src->emb->weight));
}
TEST_F(Weights, ListsMissingAndUnexpectedNames) {
  auto sd = good();
  sd.erase(sd.begin() + 1);
  sd.emplace_back("blocks.9.extra", at::zeros({1}));
  expect_refused(sd, "missing [blocks.0.norm1.weight], unexpected [blocks.9.extra]");
}
TEST_F(Weights, NamesAShapeMismatch) {
  auto sd = good();
  for (auto& [name, t] : sd)
    if (name == "blocks.2.norm2.bias") t = at::zeros({7});
  expect_refused(sd, "blocks.2.norm2.bias: shape mismatch, expected [256], got [7]");
}
TEST_F(Weights, RefusesOtherDtypes) {
  auto sd = good();
  sd[2].second = sd[2].second.to(at::kDouble);
  expect_refused(sd, "dtype Double refused");
}
TEST_F(Weights, CountsNaNAndInf) {
  auto sd = good();
  sd[2].second[0] = NAN;
  sd[2].second[1] = INFINITY;
  expect_refused(sd, sd[2].first + ": 2 NaN or Inf");
}
TEST_F(Weights, RefusesAnUntiedHead) {
  auto sd = good();
  sd.back().second = sd.front().second + 1;
  expect_refused(sd, "head.weight differs from emb.weight");
}

}  // namespace
}  // namespace tinygpt
