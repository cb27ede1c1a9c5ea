#include "loop_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

// Penalty then temperature on one row, in float32 as SPEC 6 says (temperature 0: none).
std::vector<float> scores_of(const float* x, int64_t V, const int64_t* h, int64_t T, const tinygpt::SamplingSettings& s) {
  std::vector<float> r(x, x + V);
  if (s.penalty != 1.0 && h) {
    const float p = static_cast<float>(s.penalty);
    for (int64_t id : std::set<int64_t>(h, h + T)) r[id] = r[id] > 0 ? r[id] / p : r[id] * p;
  }
  if (s.temperature > 0)
    for (float& v : r) v = v / static_cast<float>(s.temperature);
  return r;
}

void cut(std::vector<float>& r, const tinygpt::SamplingSettings& s) {
  if (s.top_k > 0) {
    std::vector<float> sorted = r;
    std::nth_element(sorted.begin(), sorted.begin() + (s.top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[s.top_k - 1];
    for (float& v : r) if (v < kth) v = kNegInf;
  }
  if (s.top_p < 1.0) {
    std::vector<int64_t> order(r.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return r[a] > r[b]; });
    const double m = r[order[0]];
    double z = 0;
    for (float v : r) z += std::exp(static_cast<double>(v) - m);
    double above = 0;
    std::vector<int64_t> dropped;
    for (int64_t i : order) {
      const double p = std::exp(static_cast<double>(r[i]) - m) / z;
#ifdef PLANTED_BUG
      if (above + p >= s.top_p && i != order[0]) dropped.push_back(i);  // the token that reaches p dropped too
#else
      if (above >= s.top_p) dropped.push_back(i);
#endif
      above += p;
    }
    for (int64_t i : dropped) r[i] = kNegInf;
  }
}

struct Rows {
  at::Tensor x, h;  // CPU float32 (B, V) and int64 (B, T) or undefined
};

Rows rows(const at::Tensor& logits, const at::Tensor& history) {
  if (logits.dim() != 2) throw std::invalid_argument("loop sampler: logits must be (B, V)");
  Rows r{logits.detach().to(at::kCPU).to(at::kFloat).contiguous(), at::Tensor()};
  if (history.defined() && history.numel() > 0) r.h = history.to(at::kCPU).to(at::kLong).contiguous();
  return r;
}

}  // namespace

at::Tensor loop_filtered(const at::Tensor& logits, const at::Tensor& history, const tinygpt::SamplingSettings& s) {
  s.validate();
  const Rows in = rows(logits, history);
  const int64_t B = in.x.size(0), V = in.x.size(1);
  at::Tensor out = at::empty({B, V}, at::kFloat);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<float> r = scores_of(in.x[b].data_ptr<float>(), V, in.h.defined() ? in.h[b].data_ptr<int64_t>() : nullptr,
                                     in.h.defined() ? in.h.size(1) : 0, s);
    cut(r, s);
    std::copy(r.begin(), r.end(), out[b].data_ptr<float>());
  }
  return out.to(logits.device());
}

at::Tensor loop_pick(const at::Tensor& logits, const at::Tensor& history, const tinygpt::SamplingSettings& s) {
  s.validate();
  if (s.temperature > 0) return at::multinomial(loop_filtered(logits, history, s).softmax(-1), 1).select(1, 0);
  const Rows in = rows(logits, history);
  const int64_t B = in.x.size(0), V = in.x.size(1);
  at::Tensor ids = at::empty({B}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<float> r = scores_of(in.x[b].data_ptr<float>(), V, in.h.defined() ? in.h[b].data_ptr<int64_t>() : nullptr,
                                     in.h.defined() ? in.h.size(1) : 0, s);
    ids[b] = std::max_element(r.begin(), r.end()) - r.begin();  // the first of equal maxima
  }
  return ids.to(logits.device());
}
