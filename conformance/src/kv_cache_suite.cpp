#include "tinygpt/conformance/kv_cache_suite.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <map>
#include <memory>
#include <sstream>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/generate.h"
#include "tinygpt/kernels.h"

namespace tinygpt::conformance {

namespace {

bool registered_here(const std::string& name) {
  for (const auto* v : checks::cache_registry().all(/*faults=*/false))
    if (v->name == name) return true;
  return false;
}

std::string model_key(const CacheCase& c) { return (c.fixture ? "fixture@" : "untrained@") + c.device.str(); }

// The model a case runs on, loaded once per process and device.
GPT& model_for(const CacheCase& c) {
  static std::map<std::string, GPT> models;
  auto it = models.find(model_key(c));
  if (it == models.end()) {
    GPT m = c.fixture ? checks::load_fixture(checks::data_dir(), c.device).model : GPT(Config{}, 0);
    m->to(c.device);
    m->eval();
    it = models.emplace(model_key(c), m).first;
  }
  return it->second;
}

// The options of every case: greedy decoding from the main prompt to 64 tokens past the window, so
// every row that reaches past the window sees the cache evict (the serving rows run past it too).
checks::EquivalenceOptions suite_options(GPT& m, const c10::Device& d) {
  constexpr int64_t kPastTheWindow = 64;
  checks::EquivalenceOptions o;
  o.prompt = checks::main_prompt(d);
  o.tokens = m->config().context + kPastTheWindow;
  return o;
}

// The references depend on the model and the prompt only: one per model and device, shared by
// every cache a binary checks.
const checks::Reference& reference_for(const CacheCase& c) {
  static std::map<std::string, std::unique_ptr<checks::Reference>> refs;
  auto& r = refs[model_key(c)];
  if (!r) {
    GPT& m = model_for(c);
    r = std::make_unique<checks::Reference>(checks::build_reference(m, suite_options(m, c.device)));
  }
  return *r;
}

checks::CacheVariant variant_for(const CacheCase& c) {
  if (!c.registered.empty()) return checks::cache_registry().get(c.registered);
  checks::CacheVariant v;
  v.name = c.name;
  v.make_cache = c.factory;
  v.kernels = c.kernels;
  return v;
}

// One case's run of the check table: its target, options and results live as long as the process,
// so every row of the case shares the main run the first of them makes.
struct CaseRun {
  checks::CacheVariant variant;
  checks::EquivalenceOptions opts;
  checks::EquivalenceResult out;
  std::unique_ptr<checks::ModelTarget> target;
  std::unique_ptr<checks::CheckContext> ctx;
};

checks::CheckContext& context_for(const std::string& suite, const CacheCase& c) {
  static std::map<std::string, std::unique_ptr<CaseRun>> runs;
  auto& run = runs[suite + "/" + kv_cache_case_name(c)];
  if (!run) {
    run = std::make_unique<CaseRun>();
    GPT& m = model_for(c);
    run->variant = variant_for(c);
    run->opts = suite_options(m, c.device);
    run->target = std::make_unique<checks::ModelTarget>(m, run->variant);
    run->ctx = std::make_unique<checks::CheckContext>(m, run->opts, *run->target, run->out, &reference_for(c));
  }
  return *run->ctx;
}

std::string test_name(const std::string& check) {
  std::string s = check;
  for (char& ch : s)
    if (ch == '-' || ch == '/') ch = '_';
  return s;
}

class CheckRowTest final : public KVCacheConformance {
 public:
  CheckRowTest(std::string suite, CacheCase c, std::string check)
      : KVCacheConformance(std::move(c)), suite_(std::move(suite)), check_(std::move(check)) {}
  void TestBody() override {
    if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
    at::NoGradGuard no_grad;
    const checks::CheckResult r = checks::run_check(checks::find_check(check_), context_for(suite_, case_));
    if (r.status == checks::Status::Skipped) GTEST_SKIP() << r.detail;
    EXPECT_TRUE(r.ok()) << (r.status == checks::Status::Error ? "ERROR " : "FAIL ") << r.name << ": " << r.detail
                        << (r.bound.empty() ? "" : " [" + r.bound + "]");
  }

 private:
  std::string suite_, check_;
};

class LengthAndBytesTest final : public KVCacheConformance {
 public:
  using KVCacheConformance::KVCacheConformance;
  void TestBody() override {
    if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
    GPT& m = model_for(case_);
    const Config& cfg = m->config();
    const checks::CacheVariant v = variant_for(case_);
    checks::Decoder d = v.decoder(cfg);
    KVCache* cache = d.cache.get();
    EXPECT_EQ(cache->length(), 0) << "a new cache holds nothing";
    at::NoGradGuard no_grad;
    const at::Tensor prompt = at::tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3}).to(case_.device);
    for (int64_t n : std::vector<int64_t>{1, 10, cfg.context - 3, cfg.context + 20}) {
      generate_cached(m, prompt, n, greedy(), *cache, d.path);
      const int64_t fed = prompt.size(1) + n - 1;  // the last token chosen is never fed
      const int64_t len = std::min(fed, cfg.context);
      EXPECT_EQ(cache->length(), len) << "after " << fed << " tokens fed";
      EXPECT_EQ(cache->bytes(), 2 * cfg.n_layers * prompt.size(0) * len * cfg.d_model * 4)
          << "2 (K and V) x layers x batch x length x d_model x 4 bytes, after " << fed << " tokens fed";
      EXPECT_GE(cache->capacity_bytes(), cache->bytes());
    }
    cache->reset();
    EXPECT_EQ(cache->length(), 0) << "after reset()";
    EXPECT_EQ(cache->bytes(), 0) << "after reset()";
  }
};

std::vector<CacheCase> cases_of(const std::string& name, const checks::CacheFactory& factory, Kernels kernels,
                                const std::string& registered) {
  std::vector<CacheCase> out;
  for (bool fixture : {true, false})
    for (auto d : {c10::Device(c10::kCPU), c10::Device(c10::kCUDA)}) {
      CacheCase c;
      c.name = registered.empty() ? name : registered;
      c.factory = factory;
      c.kernels = kernels;
      c.registered = registered;
      c.fixture = fixture;
      c.device = d;
      out.push_back(c);
    }
  return out;
}

}  // namespace

std::string KVCacheConformance::skip_reason() const {
  if (case_.device.is_cuda() && !torch::cuda::is_available()) return "CUDA case skipped: this LibTorch has no usable CUDA device";
  if (!case_.registered.empty() && !registered_here(case_.registered))
    return "cache '" + case_.registered + "' is not registered in this build (cuda-graph needs a CUDA LibTorch and a GPU)";
  return "";
}

std::vector<CacheCase> kv_cache_cases(const std::string& name, const checks::CacheFactory& factory, Kernels kernels) {
  return cases_of(name, factory, kernels, "");
}

std::vector<CacheCase> registered_cache_cases(const std::string& registered) {
  return cases_of(registered, nullptr, Kernels::Library, registered);
}

std::string kv_cache_case_name(const CacheCase& c) {
  return std::string(c.fixture ? "fixture" : "untrained") + (c.device.is_cuda() ? "_cuda" : "_cpu");
}

std::vector<std::string> kv_cache_suite_checks() {
  // The rows of statistical power cost minutes each (tinygpt verify --deep runs them on our caches).
  return checks::model_checks_with(0, checks::Tag::EngineOnly | checks::Tag::Deep);
}

void PrintTo(const CacheCase& c, std::ostream* os) {
  *os << c.name << " on " << (c.fixture ? "the shipped fixture" : "untrained weights") << ", " << c.device;
  if (c.registered.empty()) *os << ", kernels " << to_string(c.kernels);
  else *os << " (as tinygpt's registry has it)";
}

bool register_kv_cache_suite(const std::string& name, const std::vector<CacheCase>& cases, const char* data_dir) {
  if (data_dir && *data_dir) checks::set_data_dir_hint(data_dir);
  const std::string suite = name + "/KVCacheConformance";
  for (const auto& c : cases) {
    std::ostringstream about;
    PrintTo(c, &about);
    const std::string where = kv_cache_case_name(c);
    for (const auto& check : kv_cache_suite_checks())
      ::testing::RegisterTest(suite.c_str(), (test_name(check) + "/" + where).c_str(), nullptr, about.str().c_str(), __FILE__,
                              __LINE__, [suite, c, check]() -> KVCacheConformance* { return new CheckRowTest(suite, c, check); });
    ::testing::RegisterTest(suite.c_str(), ("LengthAndBytesFollowTheFormula/" + where).c_str(), nullptr, about.str().c_str(),
                            __FILE__, __LINE__, [c]() -> KVCacheConformance* { return new LengthAndBytesTest(c); });
  }
  return true;
}

}  // namespace tinygpt::conformance
