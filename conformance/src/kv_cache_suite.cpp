#include "tinygpt/conformance/kv_cache_suite.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/generate.h"
#include "tinygpt/kernels.h"

#include <map>

namespace tinygpt::conformance {

namespace {

#define TINYGPT_SKIP_WITHOUT(c)                                                                                      \
  if ((c).device.is_cuda() && !torch::cuda::is_available()) GTEST_SKIP() << "CUDA case skipped: this LibTorch has no usable CUDA device"; \
  if (!(c).registered.empty() && !registered_here((c).registered))                                                 \
  GTEST_SKIP() << "cache '" << (c).registered << "' is not registered in this build (cuda-graph needs a CUDA LibTorch and a GPU)"

bool registered_here(const std::string& name) {
  for (const auto* v : checks::cache_registry().all(/*faults=*/false))
    if (v->name == name) return true;
  return false;
}

// The model a case runs on, loaded once per process and device.
GPT& model_for(const CacheCase& c) {
  static std::map<std::string, GPT> models;
  const std::string key = (c.fixture ? "fixture@" : "untrained@") + c.device.str();
  auto it = models.find(key);
  if (it == models.end()) {
    GPT m = c.fixture ? checks::load_fixture(checks::data_dir(), c.device).model : GPT(Config{}, 0);
    m->to(c.device);
    m->eval();
    it = models.emplace(key, m).first;
  }
  return it->second;
}

checks::CacheVariant variant_for(const CacheCase& c) {
  if (!c.registered.empty()) return checks::cache_registry().get(c.registered);
  checks::CacheVariant v;
  v.name = c.name;
  v.make_cache = c.factory;
  v.kernels = c.kernels;
  return v;
}

at::Tensor ids(std::vector<int64_t> v, int64_t rows, const c10::Device& d) {
  const int64_t cols = static_cast<int64_t>(v.size()) / rows;
  return at::tensor(v, at::kLong).view({rows, cols}).to(d);
}

// Per-step logits of the production loop: (B, n, V).
at::Tensor loop_logits(GPT& m, const at::Tensor& prompt, int64_t n, checks::Decoder& d, at::Tensor* seq = nullptr) {
  at::NoGradGuard no_grad;
  Recorder keep;
  at::Tensor out = generate_cached(m, prompt, n, greedy(), *d.cache, d.path, keep.observer());
  if (seq) *seq = out;
  return keep.stacked();
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

TEST_P(KVCacheConformance, PassesEveryEquivalenceCheck) {
  const CacheCase& c = GetParam();
  TINYGPT_SKIP_WITHOUT(c);
  GPT& m = model_for(c);
  checks::EquivalenceOptions opts;
  opts.prompt = ids({1, 2, 3}, 1, c.device);
  opts.tokens = m->config().context + 64;
  const auto ref = checks::build_reference(m, opts);
  const auto r = checks::check_equivalence(m, opts, ref, variant_for(c));
  EXPECT_TRUE(r.passed()) << checks::format_equivalence(r);
}

TEST_P(KVCacheConformance, LengthAndBytesFollowTheFormula) {
  const CacheCase& c = GetParam();
  TINYGPT_SKIP_WITHOUT(c);
  GPT& m = model_for(c);
  const Config& cfg = m->config();
  const checks::CacheVariant v = variant_for(c);
  checks::Decoder d = v.decoder(cfg);
  KVCache* cache = d.cache.get();
  EXPECT_EQ(cache->length(), 0) << "a new cache holds nothing";
  at::NoGradGuard no_grad;
  const at::Tensor prompt = ids({1, 2, 3, 4, 5, 6}, 2, c.device);  // batch 2
  for (int64_t n : std::vector<int64_t>{1, 10, cfg.context - 3, cfg.context + 20}) {
    generate_cached(m, prompt, n, greedy(), *cache, d.path);
    const int64_t fed = 3 + n - 1;  // the last token chosen is never fed
    const int64_t len = std::min(fed, cfg.context);
    EXPECT_EQ(cache->length(), len) << "after " << fed << " tokens fed";
    EXPECT_EQ(cache->bytes(), 2 * cfg.n_layers * 2 * len * cfg.d_model * 4)
        << "2 (K and V) x layers x batch x length x d_model x 4 bytes, after " << fed << " tokens fed";
    EXPECT_GE(cache->capacity_bytes(), cache->bytes());
  }
}

TEST_P(KVCacheConformance, ResetStartsAFreshSequence) {
  const CacheCase& c = GetParam();
  TINYGPT_SKIP_WITHOUT(c);
  GPT& m = model_for(c);
  const checks::CacheVariant v = variant_for(c);
  checks::Decoder used = v.decoder(m->config()), fresh = v.decoder(m->config());
  generate_cached(m, ids({7, 8, 9, 10}, 1, c.device), 40, greedy(), *used.cache, used.path);
  used.cache->reset();
  EXPECT_EQ(used.cache->length(), 0);
  EXPECT_EQ(used.cache->bytes(), 0);
  const at::Tensor prompt = ids({1, 2, 3}, 1, c.device);
  const double d = max_diff(loop_logits(m, prompt, 32, used), loop_logits(m, prompt, 32, fresh));
  EXPECT_LE(d, checks::kLogitTolerance) << "a sequence after reset() differs from one on a fresh cache by " << d;
}

TEST_P(KVCacheConformance, BatchRowsEqualEachPromptAlone) {
  const CacheCase& c = GetParam();
  TINYGPT_SKIP_WITHOUT(c);
  GPT& m = model_for(c);
  const checks::CacheVariant v = variant_for(c);
  checks::Decoder dec = v.decoder(m->config());
  const at::Tensor rows = ids({1, 2, 3, 17, 250, 9, 400, 33, 1024, 2048, 5, 77}, 4, c.device);
  const int64_t n = m->config().context + 32;
  at::Tensor batched_seq;
  const at::Tensor batched = loop_logits(m, rows, n, dec, &batched_seq);
  for (int64_t b = 0; b < 4; ++b) {
    at::Tensor alone_seq;
    const at::Tensor alone = loop_logits(m, rows.narrow(0, b, 1), n, dec, &alone_seq);
    // Compare up to the first differing token (after it the sequences are not the same input).
    at::Tensor diff = (alone_seq != batched_seq.narrow(0, b, 1)).nonzero();
    const int64_t upto = diff.numel() ? diff[0][1].item<int64_t>() - 3 + 1 : n;
    const double d = max_diff(batched.narrow(0, b, 1).narrow(1, 0, upto), alone.narrow(1, 0, upto));
    EXPECT_LE(d, checks::kLogitTolerance) << "row " << b << " of 4 differs from its prompt alone by " << d << " over "
                                          << upto << " steps";
  }
}

TEST_P(KVCacheConformance, LongRunsMatchTheBandedReference) {
  const CacheCase& c = GetParam();
  TINYGPT_SKIP_WITHOUT(c);
  GPT& m = model_for(c);
  const checks::CacheVariant v = variant_for(c);
  checks::Decoder dec = v.decoder(m->config());
  const int64_t n = m->config().context * 5 / 2;
  at::Tensor seq;
  const at::Tensor got = loop_logits(m, ids({1, 2, 3}, 1, c.device), n, dec, &seq);
  const auto ref = checks::reference_for(m, seq, 3, n);
  const at::Tensor d = (got - ref.band).abs().amax({0, 2});  // (n)
  const int64_t worst = d.argmax().item<int64_t>();
  EXPECT_LE(d.max().item<double>(), checks::kLogitTolerance)
      << "step " << worst << " (position " << worst + 2 << ") differs from the banded reference by " << d.max().item<double>()
      << " after " << n << " greedy tokens";
}

std::vector<CacheCase> kv_cache_cases(const std::string& name, const checks::CacheFactory& factory, Kernels kernels) {
  std::vector<CacheCase> out;
  for (bool fixture : {true, false})
    for (auto d : {c10::Device(c10::kCPU), c10::Device(c10::kCUDA)}) {
      CacheCase c;
      c.name = name;
      c.factory = factory;
      c.kernels = kernels;
      c.fixture = fixture;
      c.device = d;
      out.push_back(c);
    }
  return out;
}

std::vector<CacheCase> registered_cache_cases(const std::string& registered) {
  std::vector<CacheCase> out;
  for (bool fixture : {true, false})
    for (auto d : {c10::Device(c10::kCPU), c10::Device(c10::kCUDA)}) {
      CacheCase c;
      c.name = registered;
      c.registered = registered;
      c.fixture = fixture;
      c.device = d;
      out.push_back(c);
    }
  return out;
}

std::string kv_cache_case_name(const ::testing::TestParamInfo<CacheCase>& info) {
  return std::string(info.param.fixture ? "fixture" : "untrained") + (info.param.device.is_cuda() ? "_cuda" : "_cpu");
}

void PrintTo(const CacheCase& c, std::ostream* os) {
  *os << c.name << " on " << (c.fixture ? "the shipped fixture" : "untrained weights") << ", " << c.device;
  if (c.registered.empty()) *os << ", kernels " << to_string(c.kernels);
  else *os << " (as tinygpt's registry has it)";
}

bool kv_cache_suite_linked(const char* data_dir) {
  if (data_dir && *data_dir) checks::set_data_dir_hint(data_dir);
  return true;
}

}  // namespace tinygpt::conformance
