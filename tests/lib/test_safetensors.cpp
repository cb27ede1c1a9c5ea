// safetensors and the .pt writer: round trips, every header validation, and Python's torch.load
// reading what we write.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tinygpt/torch_checkpoint.h"
#include "tinygpt/safetensors.h"

namespace tinygpt {
namespace {

namespace fs = std::filesystem;

fs::path tmp(const std::string& name) { return fs::temp_directory_path() / ("tinygpt_st_" + name); }

// Writes a raw safetensors file: header text and a buffer of `n` bytes.
void raw_file(const fs::path& p, const std::string& header, size_t n) {
  std::ofstream out(p, std::ios::binary);
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header << std::string(n, '\0');
}

void expect_refused(const std::string& header, size_t n, const std::string& word) {
  const auto p = tmp("bad.safetensors");
  raw_file(p, header, n);
  try {
    read_safetensors(p.string());
    FAIL() << "accepted " << header;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  std::vector<std::pair<std::string, at::Tensor>> ts = {
      {"a", at::randn({3, 4})}, {"b", at::arange(5, at::kLong)}, {"c", at::randn({2}).to(at::kHalf)}};
  const auto p = tmp("rt.safetensors");
  write_safetensors(p.string(), ts, {{"k", "v"}});
  TensorFile tf = read_safetensors(p.string());
  ASSERT_EQ(tf.tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(tf.tensors[i].first, ts[i].first);
    EXPECT_TRUE(tf.tensors[i].second.equal(ts[i].second));
  }
  EXPECT_EQ(tf.metadata.at("k"), "v");
}

TEST(Safetensors, ValidatesTheHeader) {
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "outside");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole");
  expect_refused("{\"a\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unsupported dtype");
  expect_refused("{not json", 0, "not valid JSON");
  const auto p = tmp("short.safetensors");
  std::ofstream(p, std::ios::binary) << std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10);
  EXPECT_THROW(read_safetensors(p.string()), std::runtime_error);  // header length past the end
}

TEST(Safetensors, CheckpointRoundTripKeepsTheTiedHead) {
  GPT m(Config{}, 3);
  Checkpoint ck{Config{}, 42, m->state_dict(), {}, {}};
  const auto p = tmp("ck.safetensors");
  write_safetensors_checkpoint(p.string(), ck, {{"note", "x"}});
  Checkpoint back = read_any_checkpoint(p.string());
  EXPECT_EQ(back.step, 42);
  EXPECT_EQ(back.config, Config{});
  GPT n(back.config, 9);
  load_weights(n, back.tensors);
  EXPECT_TRUE(n->emb->weight.equal(m->emb->weight));
}

TEST(TorchWriter, OurPtFileReadsBackAndPythonLoadsIt) {
  GPT m(Config{}, 5);
  Checkpoint ck{Config{}, 3000000000LL, m->state_dict(), {}, {}};
  const auto p = tmp("ours.pt");
  write_torch_checkpoint(p.string(), ck);
  Checkpoint back = read_any_checkpoint(p.string());
  EXPECT_EQ(back.step, 3000000000LL);
  ASSERT_EQ(back.tensors.size(), 64u);
  EXPECT_EQ(back.tensors.back().second.data_ptr(), back.tensors.front().second.data_ptr());  // one storage
  GPT n(back.config, 9);
  load_weights(n, back.tensors);
  EXPECT_TRUE(n->blocks[3]->as<BlockImpl>()->attn->qkv->weight.equal(m->blocks[3]->as<BlockImpl>()->attn->qkv->weight));
  const std::string cmd =
      "/usr/bin/python3 -c \"import torch,sys; c=torch.load(sys.argv[1]); sd=c['model']; "
      "assert type(sd).__name__=='OrderedDict' and len(sd)==64; "
      "assert sd['head.weight'].data_ptr()==sd['emb.weight'].data_ptr(); "
      "print(c['step'], c['config']['d_model'], float(sd['norm.weight'].sum()))\" " + p.string() + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[512] = {0};
  const bool got = fgets(buf, sizeof buf, f) != nullptr;
  const int rc = pclose(f);
  if (rc != 0 && std::string(buf).find("No module named") != std::string::npos) GTEST_SKIP() << "no python3-torch";
  ASSERT_TRUE(got && rc == 0) << buf;
  EXPECT_EQ(std::string(buf), "3000000000 256 256.0\n");
}

}  // namespace
}  // namespace tinygpt
