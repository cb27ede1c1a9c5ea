#include "tinygpt/checks/selfcheck.h"

#include <ATen/ATen.h>

#include <set>

namespace tinygpt::checks {

PickFn production_pick() {
  return [](const at::Tensor& l, const at::Tensor& h, const SamplingSettings& s) { return pick(l, s, h); };
}

std::vector<SelfCheckItem> sampler_selfcheck(const PickFn& pick_fn, c10::Device dev) {
  std::vector<SelfCheckItem> out;
  auto guarded = [&](const std::string& name, const std::function<void(SelfCheckItem&)>& body) {
    SelfCheckItem item{name, true, "", {}};
    try {
      body(item);
    } catch (const std::exception& e) {
      item.passed = false;
      std::string msg = e.what();  // LibTorch appends a backtrace after the first line
      if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
      item.detail = "threw: " + msg;
    }
    out.push_back(item);
  };
  auto row = [&](std::vector<float> v) { return at::tensor(v, at::kFloat).unsqueeze(0).to(dev); };

  guarded("greedy forms equal argmax", [&](SelfCheckItem& it) {
    at::Generator g = at::detail::createCPUGenerator(3);
    at::Tensor x = (at::randn({4, 4096}, g) * 2).to(dev);
    at::Tensor want = x.argmax(-1);
    at::manual_seed(0);
    for (auto s : {SamplingSettings{0.0, 0, 1.0, 1.0}, SamplingSettings{1.0, 1, 1.0, 1.0}, SamplingSettings{1.0, 0, 1e-9, 1.0}})
      if (!pick_fn(x, {}, s).equal(want)) {
        it.passed = false;
        it.detail = "pick(" + s.to_string() + ") != argmax";
      }
    if (it.passed) it.detail = "T=0, top_k=1, top_p=1e-9 all argmax";
  });
  guarded("top_k=5 stays in the top 5", [&](SelfCheckItem& it) {
    at::Generator g = at::detail::createCPUGenerator(4);
    at::Tensor x = at::randn({1, 4096}, g).to(dev);
    at::Tensor top5 = std::get<1>(x.topk(5, -1)).to(at::kCPU);
    std::set<int64_t> allowed(top5.data_ptr<int64_t>(), top5.data_ptr<int64_t>() + 5);
    at::manual_seed(1);
    for (int i = 0; i < 200; ++i) {
      const int64_t id = pick_fn(x, {}, {1.0, 5, 1.0, 1.0}).item<int64_t>();
      it.draws.push_back(id);
      if (!allowed.count(id) && it.passed) {
        it.passed = false;
        it.detail = "draw " + std::to_string(i) + " picked id " + std::to_string(id);
      }
    }
    if (it.passed) it.detail = "200 draws in the top 5";
  });
  guarded("top_p=0.75 draws exactly {0, 1}", [&](SelfCheckItem& it) {
    at::Tensor x = row({0.5f, 0.3f, 0.15f, 0.05f}).log();
    at::manual_seed(2);
    std::set<int64_t> seen;
    for (int i = 0; i < 500; ++i) {
      it.draws.push_back(pick_fn(x, {}, {1.0, 0, 0.75, 1.0}).item<int64_t>());
      seen.insert(it.draws.back());
    }
    it.passed = seen == std::set<int64_t>{0, 1};
    std::string ids;
    for (auto id : seen) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    it.detail = "500 draws over {" + ids + "}" + (it.passed ? "" : ", expected exactly {0,1}");
  });
  guarded("penalty 2 picks the runner-up", [&](SelfCheckItem& it) {
    at::Tensor h = at::zeros({1, 1}, at::kLong).to(dev);
    const int64_t id = pick_fn(row({2.0f, 1.5f}), h, {0.0, 0, 1.0, 2.0}).item<int64_t>();
    it.passed = id == 1;
    it.detail = "picked " + std::to_string(id) + (it.passed ? "" : ", expected 1");
  });
  return out;
}

}  // namespace tinygpt::checks
