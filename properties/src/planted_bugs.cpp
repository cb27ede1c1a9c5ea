// Planted sampler bugs: each reuses the production stages except one, re-written the way a real
// bug report had it. The property suite must catch every one (planted_bugs_test.cpp).
#include <ATen/ATen.h>

#include <limits>

#include "tinygpt/laws/sampler_under_test.h"

namespace tinygpt::props {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A pipeline with the production stages but the ones a bug rewrites.
SamplerUnderTest compose(std::string name, std::string description, SamplerStages st) {
  auto filtered = [st](const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) {
    return st.filtered(logits, history, s);
  };
  auto pick = [st](const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) {
    return st.pick(logits, history, s);
  };
  auto pick_rows = [st](const at::Tensor& logits, const at::Tensor& history, const std::vector<RowSampling>& rows, int64_t n) {
    return st.pick_rows(logits, history, rows, n);
  };
  return {std::move(name), std::move(description), filtered, pick, pick_rows};
}

// The production stages with the batch's per-row state handled by `rows` instead: the row loop of
// a serving engine's sampler, where the bugs of vLLM #51226 and #17524 lived.
SamplerUnderTest with_rows(std::string name, std::string description, RowsFn rows) {
  SamplerUnderTest s = production_sampler();
  s.name = std::move(name);
  s.description = std::move(description);
  s.pick_rows = std::move(rows);
  return s;
}

// One row of a batch (1, V) and its history (1, T) or undefined, repeated n times for n draws.
at::Tensor nth(const at::Tensor& x, int64_t b, int64_t n) { return x.narrow(0, b, 1).expand({n, x.size(1)}); }
at::Tensor nth_history(const at::Tensor& h, int64_t b, int64_t n) { return h.defined() ? nth(h, b, n) : h; }

}  // namespace

SamplerUnderTest production_sampler() {
  return {"production", "lib/ sampler",
          [](const at::Tensor& l, const at::Tensor& h, const SamplingSettings& s) { return filtered_scores(l, h, s); },
          [](const at::Tensor& l, const at::Tensor& h, const SamplingSettings& s) { return pick(l, s, h); },
          [](const at::Tensor& l, const at::Tensor& h, const std::vector<RowSampling>& r, int64_t n) { return pick_rows(l, h, r, n); }};
}

std::vector<SamplerUnderTest> planted_bugs() {
  std::vector<SamplerUnderTest> bugs;
  {
    SamplerStages st;  // drop when the cumulative mass INCLUDING the token reaches p
    st.top_p = [](const at::Tensor& scores, double top_p) {
      if (top_p >= 1.0) return scores;
      auto [sorted, order] = scores.sort(-1, true);
      at::Tensor kept = sorted.masked_fill(sorted.softmax(-1).cumsum(-1) >= top_p, kNegInf);
      return at::empty_like(scores).scatter_(-1, order, kept);
    };
    bugs.push_back(compose("topPDropsTheTokenThatReachesP", "top-p tests cum >= p instead of cum - p_i >= p", st));
  }
  {
    SamplerStages st;  // divides every score, so a negative score moves UP towards 0
    st.penalty = [](const at::Tensor& scores, const at::Tensor& history, double penalty) {
      if (penalty == 1.0 || !history.defined() || history.numel() == 0) return scores;
      at::Tensor seen = at::zeros_like(scores, scores.options().dtype(at::kBool)).scatter_(1, history, true);
      return at::where(seen, scores / penalty, scores);
    };
    bugs.push_back(compose("penaltyDividesNegativeScores", "penalty divides every seen score, raising negatives", st));
  }
  {
    SamplerStages st;  // keeps exactly k ids from topk's indices, dropping ties with the k-th
    st.top_k = [](const at::Tensor& scores, int64_t k) {
      if (k == 0) return scores;
      at::Tensor idx = std::get<1>(scores.topk(k, -1));
      at::Tensor keep = at::zeros_like(scores, scores.options().dtype(at::kBool)).scatter_(1, idx, true);
      return scores.masked_fill(keep.logical_not(), kNegInf);
    };
    bugs.push_back(compose("topKDropsTies", "top-k keeps topk()'s k indices, dropping ties with the k-th", st));
  }
  {
    SamplerStages st;  // applies the penalty once per occurrence instead of once per distinct id
    st.penalty = [](const at::Tensor& scores, const at::Tensor& history, double penalty) {
      if (penalty == 1.0 || !history.defined() || history.numel() == 0) return scores;
      at::Tensor x = scores;
      for (int64_t t = 0; t < history.size(1); ++t) {
        at::Tensor seen = at::zeros_like(x, x.options().dtype(at::kBool)).scatter_(1, history.narrow(1, t, 1), true);
        x = at::where(seen, at::where(x > 0, x / penalty, x * penalty), x);
      }
      return x;
    };
    bugs.push_back(compose("penaltyCountsRepeats", "penalty compounds for every repeat in the history", st));
  }
  {
    SamplerStages st;
    st.temperature = [](const at::Tensor& scores, double t) { return scores * t; };
    bugs.push_back(compose("temperatureMultiplies", "scores multiplied by the temperature instead of divided", st));
  }
  {
    SamplerStages st;  // keeps the k + 1 best: an off-by-one in the cut
    st.top_k = [](const at::Tensor& scores, int64_t k) {
      if (k == 0 || k >= scores.size(1)) return scores;
      return apply_top_k(scores, k + 1);
    };
    bugs.push_back(compose("topKKeepsOneTooMany", "top-k keeps the k + 1 best (an off-by-one in the cut)", st));
  }
  {
    SamplerStages st;  // argmax over the reversed row: the LAST maximal index wins ties
    st.argmax = [](const at::Tensor& x) { return (x.size(1) - 1) - x.flip(1).argmax(-1); };
    bugs.push_back(compose("greedyTakesLastTiedIndex", "temperature 0 breaks ties towards the last index", st));
  }
  // Per-row state in a batch: every stage right, the rows' generators or settings wrong.
  bugs.push_back(with_rows("oneGeneratorForTheBatch",
                           "one generator for the batch, seeded with the first row's seed: row b draws the numbers row b - 1 left",
                           [](const at::Tensor& x, const at::Tensor& h, const std::vector<RowSampling>& rows, int64_t n) {
                             const at::Generator g = make_generator(x.device(), rows.at(0).seed.value_or(0));
                             std::vector<at::Tensor> out;
                             for (int64_t b = 0; b < x.size(0); ++b)
                               out.push_back(production_stages().pick(nth(x, b, n), nth_history(h, b, n), rows[b].settings, g));
                             return at::stack(out, 0);
                           }));
  bugs.push_back(with_rows("seedsIgnoredBesideAnUnseededRow",
                           "a batch with any unseeded row draws every row unseeded (vLLM #51226 on CPU)",
                           [](const at::Tensor& x, const at::Tensor& h, const std::vector<RowSampling>& rows, int64_t n) {
                             std::vector<RowSampling> r = rows;
                             bool all_seeded = true;
                             for (const auto& row : r) all_seeded &= row.seed.has_value();
                             if (!all_seeded)
                               for (auto& row : r) row.seed.reset();
                             return production_stages().pick_rows(x, h, r, n);
                           }));
  bugs.push_back(with_rows("lastRowsSettingsForEveryRow",
                           "every row drawn with the last row's settings (its own seed): a batch's params overwritten by one request's",
                           [](const at::Tensor& x, const at::Tensor& h, const std::vector<RowSampling>& rows, int64_t n) {
                             std::vector<RowSampling> r = rows;
                             for (auto& row : r) row.settings = rows.back().settings;
                             return production_stages().pick_rows(x, h, r, n);
                           }));
  bugs.push_back(with_rows("topKOneDisabledPerRow",
                           "a row's top_k of 1 read as 'no top-k' (k <= 1 taken for off), so it samples where greedy would not",
                           [](const at::Tensor& x, const at::Tensor& h, const std::vector<RowSampling>& rows, int64_t n) {
                             std::vector<RowSampling> r = rows;
                             for (auto& row : r)
                               if (row.settings.top_k == 1) row.settings.top_k = 0;
                             return production_stages().pick_rows(x, h, r, n);
                           }));
  return bugs;
}

std::vector<SamplerUnderTest> legal_variants() {
  std::vector<SamplerUnderTest> out;
  {
    SamplerStages st;  // the seed's own top-p: torch.sort(descending=True), not a stable sort
    st.top_p = [](const at::Tensor& scores, double top_p) {
      if (top_p >= 1.0) return scores;
      auto [sorted, order] = scores.sort(/*stable=*/false, -1, /*descending=*/true);
      at::Tensor p = sorted.softmax(-1);
      at::Tensor kept = sorted.masked_fill(p.cumsum(-1) - p >= top_p, kNegInf);
      return at::empty_like(scores).scatter_(-1, order, kept);
    };
    out.push_back(compose("seedsUnstableTopPSort", "top-p over torch.sort(descending=True) as the seed's code has it", st));
  }
  {
    SamplerStages st;  // equal scores ranked by HIGHER index first: the other extreme of a legal order
    st.top_p = [](const at::Tensor& scores, double top_p) {
      if (top_p >= 1.0) return scores;
      const at::Tensor flipped = scores.flip(1);  // a stable sort of the reversed row ranks ties by higher index
      auto [sorted, order] = flipped.sort(/*stable=*/true, -1, /*descending=*/true);
      order = (scores.size(1) - 1) - order;
      at::Tensor p = sorted.softmax(-1);
      at::Tensor kept = sorted.masked_fill(p.cumsum(-1) - p >= top_p, kNegInf);
      return at::empty_like(scores).scatter_(-1, order, kept);
    };
    out.push_back(compose("topPTiesByHigherIndex", "top-p ranks equal scores by higher index first", st));
  }
  return out;
}

}  // namespace tinygpt::props
