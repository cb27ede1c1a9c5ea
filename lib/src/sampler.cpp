#include "tinygpt/sampler.h"

#include <ATen/ATen.h>

#include <mutex>
#include <random>

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace tinygpt {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
}

void SamplingSettings::validate() const {
  if (std::isnan(temperature) || temperature < 0 || std::isinf(temperature))
    throw std::invalid_argument("temperature must be a finite number >= 0 (got " + std::to_string(temperature) + ")");
  if (top_k < 0) throw std::invalid_argument("top_k must be >= 0 (got " + std::to_string(top_k) + ")");
  if (!(top_p > 0.0 && top_p <= 1.0))
    throw std::invalid_argument("top_p must be in (0, 1] (got " + std::to_string(top_p) + ")");
  if (!(penalty > 0.0) || std::isinf(penalty))
    throw std::invalid_argument("penalty must be a finite number > 0 (got " + std::to_string(penalty) + ")");
}

SamplingSettings SamplingSettings::every_stage() {
  SamplingSettings s;
  s.temperature = 0.8;
  s.top_k = 40;
  s.top_p = 0.9;
  s.penalty = 1.3;
  return s;
}

std::string SamplingSettings::to_string() const {
  std::ostringstream s;
  s << "temperature=" << temperature << " top_k=" << top_k << " top_p=" << top_p << " penalty=" << penalty;
  return s.str();
}

at::Tensor checked_scores(const at::Tensor& logits, const at::Tensor& history) {
  if (!logits.defined() || logits.dim() != 2 || !at::isFloatingType(logits.scalar_type()))
    throw std::invalid_argument("sampler: logits must be a 2-D (B, V) floating-point tensor");
  const int64_t B = logits.size(0), V = logits.size(1);
  if (B < 1 || V < 1) throw std::invalid_argument("sampler: logits must be non-empty");
  at::Tensor s = logits.to(at::kFloat).contiguous().clone();  // (B, V) float32 copy
  if (s.isnan().any().item<bool>()) throw std::invalid_argument("sampler: logits contain NaN");
  if (s.isposinf().any().item<bool>()) throw std::invalid_argument("sampler: logits contain +inf");
  if (s.isneginf().all(1).any().item<bool>())
    throw std::invalid_argument("sampler: a row of logits is entirely -inf");
  if (history.defined() && history.numel() > 0) {
    if (history.dim() != 2 || history.scalar_type() != at::kLong)
      throw std::invalid_argument("sampler: history must be a 2-D (B, T) int64 tensor");
    if (history.size(0) != B)
      throw std::invalid_argument("sampler: history has " + std::to_string(history.size(0)) +
                                  " rows but logits have " + std::to_string(B));
    const int64_t lo = history.min().item<int64_t>(), hi = history.max().item<int64_t>();
    if (lo < 0 || hi >= V)
      throw std::invalid_argument("sampler: history id " + std::to_string(lo < 0 ? lo : hi) +
                                  " outside [0, " + std::to_string(V) + ")");
  }
  return s;
}

at::Tensor apply_penalty(const at::Tensor& scores, const at::Tensor& history, double penalty) {
  if (penalty == 1.0 || !history.defined() || history.numel() == 0) return scores;
  // A (B, V) mask of the ids seen: each distinct id is penalised once, however often it occurs.
  at::Tensor seen = at::zeros_like(scores, scores.options().dtype(at::kBool))
                        .scatter_(1, history.to(scores.device()), true);
  at::Tensor pushed = at::where(scores > 0, scores / penalty, scores * penalty);
  return at::where(seen, pushed, scores);
}

at::Tensor apply_temperature(const at::Tensor& scores, double temperature) {
  if (!(temperature > 0)) throw std::invalid_argument("apply_temperature: temperature must be > 0");
  return scores / temperature;
}

at::Tensor apply_top_k(const at::Tensor& scores, int64_t k) {
  if (k == 0) return scores;
  if (k < 0 || k > scores.size(1))
    throw std::invalid_argument("top_k must be in [0, V=" + std::to_string(scores.size(1)) +
                                "] (got " + std::to_string(k) + ")");
  at::Tensor kth = std::get<0>(scores.topk(k, -1)).narrow(1, k - 1, 1);  // (B, 1)
  return scores.masked_fill(scores < kth, kNegInf);
}

at::Tensor apply_top_p(const at::Tensor& scores, double top_p) {
  if (top_p >= 1.0) return scores;
  // A stable sort: tokens of equal score keep index order, so which of them falls at the nucleus
  // boundary is defined (the seed's unstable sort leaves it to the implementation).
  auto [sorted, order] = scores.sort(/*stable=*/true, -1, /*descending=*/true);  // (B, V) each
  at::Tensor p = sorted.softmax(-1);
  // Mass ranked above each token; the top token's is 0, so it always survives.
  at::Tensor above = p.cumsum(-1) - p;
  at::Tensor kept = sorted.masked_fill(above >= top_p, kNegInf);
  return at::empty_like(scores).scatter_(-1, order, kept);
}

at::Tensor draw(const at::Tensor& scores, const c10::optional<at::Generator>& gen) {
  return at::multinomial(scores.softmax(-1), 1, /*replacement=*/false, gen).select(1, 0);  // (B)
}

at::Generator make_generator(c10::Device device, uint64_t seed) {
  // A clone of the device's default generator: the same kind, a state of its own.
  at::Generator def = at::globalContext().defaultGenerator(device);
  at::Generator g;
  {
    std::lock_guard<std::mutex> lock(def.mutex());  // another thread may be drawing from it
    g = def.clone();
  }
  g.set_current_seed(seed);
  return g;
}

at::Tensor SamplerStages::filtered(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) const {
  s.validate();
  if (s.temperature == 0) throw std::invalid_argument("filtered_scores: temperature 0 is argmax, not a distribution");
  at::Tensor x = penalty(checked_scores(logits, history), history, s.penalty);
  x = temperature(x, s.temperature);
  x = top_k(x, s.top_k);
  return top_p(x, s.top_p);
}

at::Tensor SamplerStages::pick(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s,
                               const c10::optional<at::Generator>& gen) const {
  s.validate();
  if (s.temperature == 0) return argmax(penalty(checked_scores(logits, history), history, s.penalty));  // first index on ties
  return draw(filtered(logits, history, s), gen);
}

at::Tensor SamplerStages::pick_rows(const at::Tensor& logits, const at::Tensor& history, const std::vector<RowSampling>& rows,
                                    int64_t n) const {
  const at::Tensor x = checked_scores(logits, history);  // (B, V)
  if (static_cast<int64_t>(rows.size()) != x.size(0))
    throw std::invalid_argument("pick_rows: " + std::to_string(rows.size()) + " row settings for " + std::to_string(x.size(0)) + " rows");
  if (n < 1) throw std::invalid_argument("pick_rows: n must be >= 1, got " + std::to_string(n));
  std::vector<at::Tensor> out;
  for (int64_t b = 0; b < x.size(0); ++b) {
    const RowSampling& r = rows[static_cast<size_t>(b)];
    // A generator per row: one shared by the batch would hand row b the numbers row b - 1 left.
    const uint64_t seed = r.seed ? *r.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
    const at::Generator g = make_generator(x.device(), seed);
    const at::Tensor h = history.defined() ? history.narrow(0, b, 1).expand({n, history.size(1)}) : history;
    out.push_back(pick(x.narrow(0, b, 1).expand({n, x.size(1)}), h, r.settings, g));  // (n): n draws in turn from g
  }
  return at::stack(out, 0);  // (B, n)
}

at::Tensor pick_rows(const at::Tensor& logits, const at::Tensor& history, const std::vector<RowSampling>& rows, int64_t n) {
  return production_stages().pick_rows(logits, history, rows, n);
}

const SamplerStages& production_stages() {
  static const SamplerStages stages;
  return stages;
}

at::Tensor filtered_scores(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) {
  return production_stages().filtered(logits, history, s);
}

at::Tensor filtered_probs(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) {
  return filtered_scores(logits, history, s).softmax(-1);
}

at::Tensor pick(const at::Tensor& logits, const SamplingSettings& s, const at::Tensor& history,
                const c10::optional<at::Generator>& gen) {
  return production_stages().pick(logits, history, s, gen);
}

TokenChooser sampler(const SamplingSettings& s, c10::optional<at::Generator> gen) {
  s.validate();
  return [s, gen](const at::Tensor& logits, const at::Tensor& history) { return pick(logits, s, history, gen); };
}

}  // namespace tinygpt
