#include "tinygpt/laws/selfcheck.h"

#include <ATen/ATen.h>

#include <functional>
#include <set>
#include <string>

namespace tinygpt::props {

using results::CheckResult;
using results::Status;

std::vector<CheckResult> seed_selfcheck(const ScoreFn& pick_fn, c10::Device dev, std::vector<std::vector<int64_t>>* draws) {
  std::vector<CheckResult> out;
  if (draws) draws->clear();
  auto item = [&](const std::string& name, const std::function<void(CheckResult&, std::vector<int64_t>&)>& body) {
    CheckResult r;
    r.name = name;
    std::vector<int64_t> drawn;
    try {
      body(r, drawn);
    } catch (const std::exception& e) {
      r = results::error_result(name, std::string("threw: ") + e.what());
    }
    out.push_back(r);
    if (draws) draws->push_back(drawn);
  };
  auto fail = [](CheckResult& r, std::string why) {
    r.status = Status::Fail;
    r.detail = std::move(why);
  };
  auto row = [&](std::vector<float> v) { return at::tensor(v, at::kFloat).unsqueeze(0).to(dev); };

  item("greedy forms equal argmax", [&](CheckResult& r, std::vector<int64_t>&) {
    at::Generator g = at::detail::createCPUGenerator(3);
    at::Tensor x = (at::randn({4, 4096}, g) * 2).to(dev);
    at::Tensor want = x.argmax(-1);
    at::manual_seed(0);
    for (auto s : {SamplingSettings{0.0, 0, 1.0, 1.0}, SamplingSettings{1.0, 1, 1.0, 1.0}, SamplingSettings{1.0, 0, 1e-9, 1.0}})
      if (!pick_fn(x, {}, s).equal(want)) return fail(r, "pick(" + s.to_string() + ") != argmax");
    r.detail = "T=0, top_k=1, top_p=1e-9 all argmax";
  });
  item("top_k=5 stays in the top 5", [&](CheckResult& r, std::vector<int64_t>& drawn) {
    at::Generator g = at::detail::createCPUGenerator(4);
    at::Tensor x = at::randn({1, 4096}, g).to(dev);
    at::Tensor top5 = std::get<1>(x.topk(5, -1)).to(at::kCPU);
    std::set<int64_t> allowed(top5.data_ptr<int64_t>(), top5.data_ptr<int64_t>() + 5);
    at::manual_seed(1);
    for (int i = 0; i < 200; ++i) {
      const int64_t id = pick_fn(x, {}, {1.0, 5, 1.0, 1.0}).item<int64_t>();
      drawn.push_back(id);
      if (!allowed.count(id) && r.ok()) fail(r, "draw " + std::to_string(i) + " picked id " + std::to_string(id));
    }
    if (r.ok()) r.detail = "200 draws in the top 5";
  });
  item("top_p=0.75 draws exactly {0, 1}", [&](CheckResult& r, std::vector<int64_t>& drawn) {
    at::Tensor x = row({0.5f, 0.3f, 0.15f, 0.05f}).log();
    at::manual_seed(2);
    std::set<int64_t> seen;
    for (int i = 0; i < 500; ++i) {
      drawn.push_back(pick_fn(x, {}, {1.0, 0, 0.75, 1.0}).item<int64_t>());
      seen.insert(drawn.back());
    }
    std::string ids;
    for (auto id : seen) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    r.detail = "500 draws over {" + ids + "}";
    if (seen != std::set<int64_t>{0, 1}) fail(r, r.detail + ", expected exactly {0,1}");
  });
  item("penalty 2 picks the runner-up", [&](CheckResult& r, std::vector<int64_t>&) {
    at::Tensor h = at::zeros({1, 1}, at::kLong).to(dev);
    const int64_t id = pick_fn(row({2.0f, 1.5f}), h, {0.0, 0, 1.0, 2.0}).item<int64_t>();
    r.detail = "picked " + std::to_string(id);
    if (id != 1) fail(r, r.detail + ", expected 1");
  });
  return out;
}

}  // namespace tinygpt::props
