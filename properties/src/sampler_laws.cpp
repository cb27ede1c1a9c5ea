#include "tinygpt/laws/sampler_laws.h"

#include "tinygpt/laws/selfcheck.h"
#include "tinygpt/laws/spec6_model.h"

#include <ATen/ATen.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

namespace tinygpt::props {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Generated logits (B, V) on `dev`. The description is generated, the values are drawn from it
// with a seeded generator, so shrinking works on B, V and the style, not on 32k floats.
at::Tensor gen_logits(c10::Device dev, int64_t min_v = 2) {
  const int64_t B = *rc::gen::inRange<int64_t>(1, 9);
  const int64_t V = *rc::gen::oneOf(rc::gen::inRange<int64_t>(min_v, 17), rc::gen::inRange<int64_t>(min_v, 4097));
  const int style = *rc::gen::inRange(0, 5);
  const int inf_pct = *rc::gen::element(0, 0, 10, 50);
  const auto seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
  static const char* styles[] = {"normal", "integer ties", "huge 1e30", "tiny 1e-30", "tied top"};
  RC_CLASSIFY(true, styles[style]);
  RC_CLASSIFY(inf_pct > 0, "-inf entries");
  RC_CLASSIFY(B > 1, "B > 1");
  RC_CLASSIFY(V >= 1024, "V >= 1024");
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::Tensor x = at::randn({B, V}, g, at::kFloat) * 3;
  if (style == 1) x = at::randint(0, 4, {B, V}, g, at::kLong).to(at::kFloat);
  if (style == 2) x = x * 1e30f;
  if (style == 3) x = x * 1e-30f;
  if (style == 4) {
    at::Tensor other = at::randint(0, V, {B, 1}, g, at::kLong);
    x.scatter_(1, other, std::get<0>(x.max(1, true)));
  }
  if (inf_pct > 0) {
    at::Tensor drop = at::rand({B, V}, g) < inf_pct / 100.0;
    drop.scatter_(1, at::randint(0, V, {B, 1}, g, at::kLong), false);  // one finite entry per row
    x.masked_fill_(drop, -kInf);
  }
  return x.to(dev);
}

double gen_temperature() { return *rc::gen::inRange(5, 500) / 100.0; }   // 0.05 .. 5
double gen_top_p() { return *rc::gen::inRange(1, 1001) / 1000.0; }      // 0.001 .. 1

at::Tensor cpu64(const at::Tensor& t) { return t.to(at::kCPU).to(at::kDouble).contiguous(); }

// Ids of a row whose filtered score is finite (the ones `draw` can return).
std::vector<bool> alive(const at::Tensor& filtered_row) {
  at::Tensor f = cpu64(filtered_row);
  std::vector<bool> out(f.size(0));
  for (int64_t i = 0; i < f.size(0); ++i) out[i] = f[i].item<double>() > -kInf;
  return out;
}

std::vector<double> row(const at::Tensor& t, int64_t b) {
  at::Tensor r = cpu64(t[b]);
  return std::vector<double>(r.data_ptr<double>(), r.data_ptr<double>() + r.numel());
}

// Double-precision softmax of one row of scores.
std::vector<double> softmax64(const std::vector<double>& s) {
  const double m = *std::max_element(s.begin(), s.end());
  std::vector<double> p(s.size());
  double z = 0;
  for (size_t i = 0; i < s.size(); ++i) z += (p[i] = std::exp(s[i] - m));
  for (auto& v : p) v /= z;
  return p;
}

// Scores divided by the temperature exactly as float32 does it: the reference order of ties.
at::Tensor scaled(const at::Tensor& logits, double t) { return logits.to(at::kFloat) / t; }

double kth_largest(std::vector<double> s, int64_t k) {
  std::sort(s.begin(), s.end(), std::greater<double>());
  return s[k - 1];
}

at::Tensor no_history() { return at::Tensor(); }

at::Tensor gen_history(int64_t B, int64_t V, c10::Device dev) {
  const int64_t T = *rc::gen::inRange<int64_t>(1, 12);
  const auto seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randint(0, V, {B, T}, g, at::kLong).to(dev);
}

bool in_max_set(const std::vector<double>& s, int64_t id) {
  return s[id] == *std::max_element(s.begin(), s.end());
}

std::vector<float> row_f(const at::Tensor& t, int64_t b) {
  at::Tensor r = t[b].to(at::kCPU).to(at::kFloat).contiguous();
  return std::vector<float>(r.data_ptr<float>(), r.data_ptr<float>() + r.numel());
}

std::vector<int64_t> row_i(const at::Tensor& t, int64_t b) {
  at::Tensor r = t[b].to(at::kCPU).contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

// The nucleus slack: a float32 cumulative sum over up to 4096 probabilities against a double one.
constexpr double kNucleusSlack = 1e-4;
// The generic laws leave top-k's tie rule to the fixed check named for it (topKDrawsEveryTokenTiedWithTheKth):
// an engine that keeps exactly k tokens fails that one row and passes the rest.
constexpr bool kTiesAtKEither = true;

// A case where every stage binds at once: top-k below V with top-p below 1 whose boundary lands
// inside the top-k set, a penalty other than 1 on a history of several distinct top ids with
// repeats, a temperature on either side of 1, and often a tie at the k-th score.
struct BindingCase {
  at::Tensor logits, history;  // (B, V) and (B, T) on the device
  SamplingSettings settings;
};

BindingCase gen_binding_case(c10::Device dev) {
  const int64_t B = *rc::gen::inRange<int64_t>(1, 5);
  const int64_t V = *rc::gen::oneOf(rc::gen::inRange<int64_t>(8, 65), rc::gen::inRange<int64_t>(8, 4097));
  const bool integer = *rc::gen::element(false, false, true);
  const bool tie_at_k = *rc::gen::arbitrary<bool>();
  const auto seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::Tensor x = integer ? at::randint(-3, 6, {B, V}, g, at::kLong).to(at::kFloat) : at::randn({B, V}, g, at::kFloat) * 2;
  SamplingSettings s;
  s.top_k = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(V - 1, 48) + 1);
  s.temperature = *rc::gen::oneOf(rc::gen::inRange(20, 100), rc::gen::inRange(101, 300)) / 100.0;
  s.penalty = *rc::gen::oneOf(rc::gen::inRange(105, 300), rc::gen::inRange(40, 96)) / 100.0;
  // History: ids among each row's top k + 4 (where the penalty can change the outcome), repeated.
  const int64_t T = *rc::gen::inRange<int64_t>(2, 17);
  at::Tensor top = std::get<1>(x.topk(std::min(V, s.top_k + 4), -1));  // (B, k + 4)
  at::Tensor pick = at::randint(0, top.size(1), {B, T}, g, at::kLong);
  at::Tensor history = top.gather(1, pick);  // (B, T), repeats likely
  if (tie_at_k) {  // a token outside the top k made equal to the k-th (neither in the history)
    for (int64_t b = 0; b < B; ++b) {
      auto sorted = std::get<1>(x[b].sort(/*stable=*/true, 0, true));
      const int64_t kth = sorted[s.top_k - 1].item<int64_t>();
      for (int64_t r = s.top_k; r < V; ++r) {
        const int64_t id = sorted[r].item<int64_t>();
        if (!(history[b] == id).any().item<bool>() && !(history[b] == kth).any().item<bool>()) {
          x[b][id] = x[b][kth];
          break;
        }
      }
    }
  }
  // top_p: the boundary at a random rank inside row 0's top-k survivors (the model says where).
  const std::vector<float> s0 = spec6::scale(spec6::penalize(row_f(x, 0), row_i(history, 0), s.penalty), s.temperature);
  const std::vector<bool> alive = spec6::top_k(s0, s.top_k);
  std::vector<double> p = spec6::distribution(s0, alive);
  std::sort(p.begin(), p.end(), std::greater<double>());
  const int64_t survivors = std::count(alive.begin(), alive.end(), true);
  if (survivors >= 2) {
    const int64_t j = *rc::gen::inRange<int64_t>(1, survivors);  // the first dropped rank
    double lo = 0;
    for (int64_t r = 0; r < j - 1; ++r) lo += p[r];
    const double hi = lo + p[j - 1], u = *rc::gen::inRange(5, 96) / 100.0;
    s.top_p = lo + u * (hi - lo);  // mass above rank j - 1 is lo < top_p, above rank j is hi >= top_p
  } else {
    s.top_p = *rc::gen::inRange(1, 100) / 100.0;
  }
  RC_PRE(s.top_p > 0.0 && s.top_p < 1.0);
  // Which stages change row 0's result: the share with all four is reported (see README).
  const auto full = spec6::filter(row_f(x, 0), row_i(history, 0), {s.temperature, s.top_k, s.top_p, s.penalty}, 0);
  auto differs = [&](const spec6::Settings& without) {
    const auto other = spec6::filter(row_f(x, 0), row_i(history, 0), without, 0);
    std::vector<bool> a(full.fate.size()), b(other.fate.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = full.fate[i] != spec6::Fate::Dropped, b[i] = other.fate[i] != spec6::Fate::Dropped;
    if (a != b) return true;
    const auto pa = spec6::distribution(full.scores, a), pb = spec6::distribution(other.scores, b);
    for (size_t i = 0; i < pa.size(); ++i)
      if (std::abs(pa[i] - pb[i]) > 1e-9) return true;
    return false;
  };
  const bool pen = differs({s.temperature, s.top_k, s.top_p, 1.0}), tem = differs({1.0, s.top_k, s.top_p, s.penalty});
  const bool tk = differs({s.temperature, 0, s.top_p, s.penalty}), tp = differs({s.temperature, s.top_k, 1.0, s.penalty});
  RC_CLASSIFY(pen && tem && tk && tp, "all four stages change the result");
  RC_CLASSIFY(tie_at_k, "tie at the k-th planted");
  RC_CLASSIFY(integer, "integer logits");
  return {x.to(dev), history.to(dev), s};
}

// Greedy and top-k: what survives the k-th score, and who wins at T = 0.
void greedy_and_top_k_laws(std::vector<Law>& laws) {
  // Which of equal maxima greedy takes is a fixed check of its own (greedyPicksTheFirstOfEqualMaxima).
  laws.push_back({"temperatureZeroIsArgmax", "pick(T=0) in argmax set of logits",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor ids = sut.pick(x, no_history(), {0.0, 0, 1.0, 1.0}).to(at::kCPU);
                    for (int64_t b = 0; b < x.size(0); ++b) RC_ASSERT(in_max_set(row(x, b), ids[b].item<int64_t>()));
                  }, true});

  laws.push_back({"topKOnePicksATopScoringToken", "pick(top_k=1, any T > 0, any top_p) in argmax set",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor ids = sut.pick(x, no_history(), {gen_temperature(), 1, gen_top_p(), 1.0}).to(at::kCPU);
                    for (int64_t b = 0; b < x.size(0); ++b) RC_ASSERT(in_max_set(row(x, b), ids[b].item<int64_t>()));
                  }, true});

  laws.push_back({"topPBelowTheTopProbabilityPicksATopScoringToken",
                  "top_p < max softmax(logits/T) => pick in argmax set",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    const double t = gen_temperature(), u = *rc::gen::inRange(1, 100) / 100.0;
                    // One top_p for the batch: below every row's top probability.
                    double pmax = 1.0;
                    for (int64_t b = 0; b < x.size(0); ++b) {
                      auto p = softmax64(row(scaled(x, t), b));
                      pmax = std::min(pmax, *std::max_element(p.begin(), p.end()));
                    }
                    const double top_p = pmax * u * 0.99;
                    RC_PRE(top_p > 0.0);
                    at::Tensor ids = sut.pick(x, no_history(), {t, 0, top_p, 1.0}).to(at::kCPU);
                    for (int64_t b = 0; b < x.size(0); ++b) RC_ASSERT(in_max_set(row(x, b), ids[b].item<int64_t>()));
                  }, true});

  laws.push_back({"topKNeverLeavesTheTopK", "filtered(top_k=k)[i] > -inf => score_i >= k-th largest",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    const int64_t k = *rc::gen::inRange<int64_t>(1, x.size(1) + 1);
                    const double t = gen_temperature();
                    at::Tensor f = sut.filtered(x, no_history(), {t, k, 1.0, 1.0});
                    for (int64_t b = 0; b < x.size(0); ++b) {
                      auto s = row(scaled(x, t), b);
                      const double kth = kth_largest(s, k);
                      auto a = alive(f[b]);
                      for (size_t i = 0; i < s.size(); ++i) RC_ASSERT(!a[i] || s[i] >= kth);
                    }
                  }});

  laws.push_back({"topKKeepsEveryTokenTiedWithTheKth", "score_i >= k-th largest (finite) => filtered(top_k=k)[i] > -inf",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    const int64_t k = *rc::gen::inRange<int64_t>(1, x.size(1) + 1);
                    const double t = gen_temperature();
                    at::Tensor f = sut.filtered(x, no_history(), {t, k, 1.0, 1.0});
                    for (int64_t b = 0; b < x.size(0); ++b) {
                      auto s = row(scaled(x, t), b);
                      const double kth = kth_largest(s, k);
                      RC_CLASSIFY(std::count(s.begin(), s.end(), kth) > 1, "ties at the k-th");
                      auto a = alive(f[b]);
                      for (size_t i = 0; i < s.size(); ++i) RC_ASSERT(a[i] || s[i] < kth || s[i] == -kInf);
                    }
                  }});

  // The minimal nucleus, computed in double from the sorted probabilities: a token may survive
  // when the mass STRICTLY above it is below p, and must survive when even the mass of every
  // other token at least as likely is below p. 1e-4 absorbs float32 cumsum rounding.
}

// Top-p: the minimal nucleus, from both sides.
void top_p_laws(std::vector<Law>& laws) {
  auto nucleus_law = [](bool must_keep) {
    return [must_keep](const SamplerUnderTest& sut, c10::Device dev) {
      at::Tensor x = gen_logits(dev);
      const double t = gen_temperature(), top_p = gen_top_p();
      RC_CLASSIFY(top_p < 0.1, "top_p < 0.1");
      at::Tensor f = sut.filtered(x, no_history(), {t, 0, top_p, 1.0});
      for (int64_t b = 0; b < x.size(0); ++b) {
        auto p = softmax64(row(scaled(x, t), b));
        auto a = alive(f[b]);
        for (size_t i = 0; i < p.size(); ++i) {
          double strictly_above = 0, at_least = 0;
          for (size_t j = 0; j < p.size(); ++j) {
            if (j == i) continue;
            if (p[j] > p[i]) strictly_above += p[j];
            if (p[j] >= p[i]) at_least += p[j];
          }
          if (must_keep) {
            if (p[i] > 0 && at_least < top_p - 1e-4) RC_ASSERT(a[i]);
          } else if (a[i]) {
            RC_ASSERT(strictly_above < top_p + 1e-4);
          }
        }
      }
    };
  };
  laws.push_back({"topPNeverPicksOutsideTheMinimalNucleus", "filtered(top_p)[i] > -inf => mass above i < p",
                  nucleus_law(false)});
  laws.push_back({"topPKeepsTheMinimalNucleus", "mass of all others >= p_i below p => filtered(top_p)[i] > -inf",
                  nucleus_law(true)});
}

// The repetition penalty: identity at 1, never a raise, each distinct id once.
void penalty_laws(std::vector<Law>& laws) {
  laws.push_back({"penaltyOneIsTheIdentity", "filtered(penalty=1, history) == filtered(no history)",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor h = gen_history(x.size(0), x.size(1), dev);
                    RC_ASSERT(sut.filtered(x, h, {1.0, 0, 1.0, 1.0}).equal(sut.filtered(x, no_history(), {1.0, 0, 1.0, 1.0})));
                  }});

  laws.push_back({"penaltyNeverRaisesAScore", "penalty >= 1 => filtered(penalty, history) <= logits",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor h = gen_history(x.size(0), x.size(1), dev);
                    const double pen = *rc::gen::inRange(100, 500) / 100.0;
                    at::Tensor f = sut.filtered(x, h, {1.0, 0, 1.0, pen});
                    RC_ASSERT((f <= x.to(at::kFloat)).all().item<bool>());
                  }});

  laws.push_back({"penaltyLeavesUnseenTokensUntouched", "i not in history => filtered(penalty)[i] == logits[i]",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor h = gen_history(x.size(0), x.size(1), dev);
                    const double pen = *rc::gen::inRange(10, 500) / 100.0;
                    at::Tensor f = sut.filtered(x, h, {1.0, 0, 1.0, pen});
                    at::Tensor seen = at::zeros_like(x, x.options().dtype(at::kBool)).scatter_(1, h, true);
                    RC_ASSERT(f.masked_select(seen.logical_not()).equal(x.to(at::kFloat).masked_select(seen.logical_not())));
                  }});

  laws.push_back({"penaltyCountsEachDistinctIdOnce", "filtered(history ++ history) == filtered(history)",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor h = gen_history(x.size(0), x.size(1), dev);
                    const double pen = *rc::gen::inRange(101, 500) / 100.0;
                    const SamplingSettings s{1.0, 0, 1.0, pen};
                    RC_ASSERT(sut.filtered(x, at::cat({h, h}, 1), s).equal(sut.filtered(x, h, s)));
                  }});

  laws.push_back({"repeatedTopTokenFallsBelowTheRunnerUp",
                  "0 < s2 < s1, penalty > s1/s2, top in history => pick(T=0) != top",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    // Positive scores with a unique top: bump each row's argmax by 0.5.
                    at::Tensor x = gen_logits(dev).abs().clamp_max(1e6) + 0.01;
                    at::Tensor top = x.argmax(-1, true);  // (B, 1)
                    x.scatter_add_(1, top, at::full({x.size(0), 1}, 0.5f, x.options()));
                    const double stretch = 1.0 + *rc::gen::inRange(1, 100) / 100.0;
                    double pen = 1.0;
                    for (int64_t b = 0; b < x.size(0); ++b) {
                      auto s = row(x, b);
                      std::sort(s.begin(), s.end(), std::greater<double>());
                      pen = std::max(pen, s[0] / s[1] * stretch);
                    }
                    RC_PRE(std::isfinite(pen));
                    at::Tensor ids = sut.pick(x, top, {0.0, 0, 1.0, pen});
                    RC_ASSERT(!(ids == top.squeeze(1)).any().item<bool>());
                  }, true});
}

// Temperature: order kept, a lower one never flattens.
void temperature_laws(std::vector<Law>& laws) {
  laws.push_back({"temperatureKeepsTheOrder", "s_i < s_j => filtered(T)_i <= filtered(T)_j",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor f = sut.filtered(x, no_history(), {gen_temperature(), 0, 1.0, 1.0});
                    at::Tensor order = x.argsort(-1, /*descending=*/false);
                    at::Tensor fs = f.gather(1, order);
                    RC_ASSERT((fs.narrow(1, 1, fs.size(1) - 1) >= fs.narrow(1, 0, fs.size(1) - 1)).all().item<bool>());
                  }});

  laws.push_back({"lowerTemperatureNeverLowersTheTopProbability", "T1 < T2 => max p(T1) >= max p(T2)",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    double t1 = gen_temperature(), t2 = gen_temperature();
                    RC_PRE(t1 != t2);
                    if (t1 > t2) std::swap(t1, t2);
                    at::Tensor p1 = sut.filtered(x, no_history(), {t1, 0, 1.0, 1.0}).softmax(-1).amax(-1);
                    at::Tensor p2 = sut.filtered(x, no_history(), {t2, 0, 1.0, 1.0}).softmax(-1).amax(-1);
                    RC_ASSERT((p1 >= p2 - 1e-6).all().item<bool>());
                  }});
}

// Against the plain model of SPEC 6 (spec6_model.cpp), with every stage active at once.
void spec6_model_laws(std::vector<Law>& laws) {
  laws.push_back({"neverDrawsAnImpossibleToken", "pick = i => logits_i > -inf and filtered p_i > 0",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor h = gen_history(x.size(0), x.size(1), dev);
                    const int64_t k = *rc::gen::inRange<int64_t>(0, x.size(1) + 1);
                    const SamplingSettings s{gen_temperature(), k, gen_top_p(), *rc::gen::inRange(50, 300) / 100.0};
                    at::Tensor p = sut.filtered(x, h, s).softmax(-1);
                    at::manual_seed(*rc::gen::inRange<uint64_t>(0, 1u << 30));
                    for (int rep = 0; rep < 8; ++rep) {
                      at::Tensor ids = sut.pick(x, h, s).unsqueeze(1);  // (B, 1)
                      RC_ASSERT((p.gather(1, ids) > 0).all().item<bool>());
                      RC_ASSERT((x.gather(1, ids) > -kInf).all().item<bool>());
                    }
                  }});

  // Against the plain model of SPEC 6 (spec6_model.h), with every stage binding at once.
  laws.push_back({"survivorsMatchTheSpec6Model",
                  "filtered(x)_i > -inf <=> model keeps i (either way within 1e-4 of the nucleus boundary)",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    const BindingCase c = gen_binding_case(dev);
                    at::Tensor f = sut.filtered(c.logits, c.history, c.settings);
                    const spec6::Settings ms{c.settings.temperature, c.settings.top_k, c.settings.top_p, c.settings.penalty};
                    for (int64_t b = 0; b < c.logits.size(0); ++b) {
                      const auto m = spec6::filter(row_f(c.logits, b), row_i(c.history, b), ms, kNucleusSlack, kTiesAtKEither);
                      const auto got = row_f(f, b);
                      for (size_t i = 0; i < got.size(); ++i) {
                        if (m.fate[i] == spec6::Fate::Either) continue;
                        RC_ASSERT((got[i] > -INFINITY) == (m.fate[i] == spec6::Fate::Kept));
                      }
                    }
                  }});

  laws.push_back({"probabilitiesMatchTheSpec6Model",
                  "|softmax(filtered(x)) - model distribution over the same survivors| <= 1e-6",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    const BindingCase c = gen_binding_case(dev);
                    at::Tensor f = sut.filtered(c.logits, c.history, c.settings);
                    at::Tensor p = f.softmax(-1);
                    const spec6::Settings ms{c.settings.temperature, c.settings.top_k, c.settings.top_p, c.settings.penalty};
                    for (int64_t b = 0; b < c.logits.size(0); ++b) {
                      const auto m = spec6::filter(row_f(c.logits, b), row_i(c.history, b), ms, kNucleusSlack, kTiesAtKEither);
                      const auto got = row_f(f, b);
                      std::vector<bool> support(got.size());
                      for (size_t i = 0; i < got.size(); ++i) {
                        support[i] = got[i] > -INFINITY;
                        RC_ASSERT(m.fate[i] == spec6::Fate::Either || support[i] == (m.fate[i] == spec6::Fate::Kept));
                      }
                      const auto want = spec6::distribution(m.scores, support);
                      const auto pb = row(p, b);
                      for (size_t i = 0; i < want.size(); ++i) RC_ASSERT(std::abs(pb[i] - want[i]) <= 1e-6);
                    }
                  }});

  laws.push_back({"greedyMatchesTheSpec6Model", "pick(T=0, penalty, history) has the model's largest penalised score",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    BindingCase c = gen_binding_case(dev);
                    c.settings.temperature = 0.0;
                    at::Tensor ids = sut.pick(c.logits, c.history, c.settings).to(at::kCPU);
                    for (int64_t b = 0; b < c.logits.size(0); ++b) {
                      const auto pen = spec6::penalize(row_f(c.logits, b), row_i(c.history, b), c.settings.penalty);
                      const int64_t want = spec6::greedy(row_f(c.logits, b), row_i(c.history, b), c.settings.penalty);
                      const int64_t got = ids[b].item<int64_t>();
                      RC_ASSERT(got >= 0);
                      RC_ASSERT(got < static_cast<int64_t>(pen.size()));
                      RC_ASSERT(pen[static_cast<size_t>(got)] == pen[static_cast<size_t>(want)]);
                    }
                  }, true});

  laws.push_back({"drawsStayInTheSpec6Support",
                  "every stage binding: pick = i (16 draws a row) => the SPEC 6 model keeps i",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    const BindingCase c = gen_binding_case(dev);
                    const int64_t B = c.logits.size(0), N = 16;
                    at::Tensor ids = sut.pick(c.logits.repeat({N, 1}), c.history.repeat({N, 1}), c.settings).to(at::kCPU);
                    const auto& s = c.settings;
                    for (int64_t b = 0; b < B; ++b) {
                      const auto m = spec6::filter(row_f(c.logits, b), row_i(c.history, b),
                                                   {s.temperature, s.top_k, s.top_p, s.penalty}, kNucleusSlack, kTiesAtKEither);
                      for (int64_t r = 0; r < N; ++r) {
                        const int64_t id = ids[r * B + b].item<int64_t>();
                        RC_ASSERT(id >= 0);
                        RC_ASSERT(id < static_cast<int64_t>(m.fate.size()));
                        RC_ASSERT(m.fate[id] != spec6::Fate::Dropped);
                      }
                    }
                  }, true});
}

// The seed: the same seed draws the same ids.
void seed_laws(std::vector<Law>& laws) {
  laws.push_back({"theSameSeedGivesTheSameDraws", "seed(s); pick == seed(s); pick",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    const SamplingSettings s{gen_temperature(), 0, gen_top_p(), 1.0};
                    const auto seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
                    at::manual_seed(seed);
                    at::Tensor a = sut.pick(x, no_history(), s);
                    at::manual_seed(seed);
                    RC_ASSERT(a.equal(sut.pick(x, no_history(), s)));
                  }, true});
}

// Per-row sampler state in a batch (a serving engine's requests each carry a seed and settings):
// a row's draws are its own business (vLLM #51226, #17524, #50440), and top_k = 1 is greedy's choice
// beside a greedy row (vLLM #5404).
void row_state_laws(std::vector<Law>& laws) {
  laws.push_back({"aSeededRowDrawsTheSameAloneAndBesideAnyNeighbours",
                  "seed(b) given => pick_rows(batch)[b] == pick_rows({row b})[0] == pick_rows(reversed batch)[b], "
                  "whatever the neighbours' settings and seeds (seeded, unseeded, greedy)",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    const int64_t B = *rc::gen::inRange<int64_t>(2, 7), n = 8;
                    const int64_t V = *rc::gen::oneOf(rc::gen::inRange<int64_t>(2, 65), rc::gen::inRange<int64_t>(2, 4097));
                    at::Generator g = at::detail::createCPUGenerator(*rc::gen::inRange<uint64_t>(0, 1u << 30));
                    const at::Tensor x = (at::randn({B, V}, g, at::kFloat) * 1.5).to(dev);  // spread enough for draws to vary
                    const at::Tensor h = gen_history(B, V, dev);
                    std::vector<RowSampling> rows(static_cast<size_t>(B));
                    // inRange grows with RapidCheck's size from its low end: the rare cases take the high values.
                    for (auto& r : rows) {
                      const bool greedy = *rc::gen::inRange(0, 6) == 5;
                      r.settings = {greedy ? 0.0 : gen_temperature(), std::min<int64_t>(V, *rc::gen::element<int64_t>(0, 0, 0, 1, 2, 5, 40)),
                                    *rc::gen::element(1.0, 1.0, 0.5, 0.9, 0.99), *rc::gen::element(1.0, 1.0, 1.3, 0.8)};
                      if (*rc::gen::inRange(0, 4) != 3) r.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
                    }
                    if (*rc::gen::arbitrary<bool>() && rows[0].seed) rows[B - 1].seed = rows[0].seed;  // two rows, one seed
                    bool any_seeded = false, unseeded = false, greedy = false;
                    for (const auto& r : rows) any_seeded |= r.seed.has_value(), unseeded |= !r.seed, greedy |= r.settings.temperature == 0;
                    RC_PRE(any_seeded);
                    RC_CLASSIFY(unseeded, "an unseeded neighbour");
                    RC_CLASSIFY(greedy, "a greedy neighbour");
                    const at::Tensor batch = sut.pick_rows(x, h, rows, n).to(at::kCPU);  // (B, n)
                    RC_ASSERT(batch.size(0) == B);
                    RC_ASSERT(batch.size(1) == n);
                    const std::vector<RowSampling> reversed(rows.rbegin(), rows.rend());
                    const at::Tensor again = sut.pick_rows(x.flip(0), h.flip(0), reversed, n).to(at::kCPU);
                    for (int64_t b = 0; b < B; ++b) {
                      if (!rows[b].seed) continue;
                      const at::Tensor alone = sut.pick_rows(x.narrow(0, b, 1), h.narrow(0, b, 1), {rows[b]}, n).to(at::kCPU);
                      RC_ASSERT(batch[b].equal(alone[0]));
                      RC_ASSERT(again[B - 1 - b].equal(alone[0]));
                    }
                  }, true, true});

  laws.push_back({"topKOneDrawsWhatGreedyPicksBesideIt",
                  "rows on the same logits and history in one batch: every draw of a top_k = 1 row (any T, top_p, seed) has "
                  "the largest penalised score, as the greedy row's pick does (equal to it where that score is unique)",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    const at::Tensor base = gen_logits(dev);  // (B0, V), tied tops among its styles
                    const int64_t B0 = base.size(0), n = 8;
                    const at::Tensor hist = gen_history(B0, base.size(1), dev);
                    std::vector<RowSampling> rows;
                    std::vector<int64_t> src;
                    for (int64_t b = 0; b < B0; ++b) {
                      const double pen = *rc::gen::element(1.0, 1.0, 1.3, 0.7);
                      RowSampling greedy{{0.0, 0, 1.0, pen}, std::nullopt}, one{{gen_temperature(), 1, gen_top_p(), pen}, std::nullopt};
                      if (*rc::gen::arbitrary<bool>()) one.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
                      const bool first = *rc::gen::arbitrary<bool>();  // either order in the batch
                      rows.push_back(first ? greedy : one), rows.push_back(first ? one : greedy);
                      src.push_back(b), src.push_back(b);
                    }
                    const at::Tensor idx = at::tensor(src, at::kLong).to(dev);
                    const at::Tensor ids = sut.pick_rows(base.index_select(0, idx), hist.index_select(0, idx), rows, n).to(at::kCPU);
                    for (size_t r = 0; r < rows.size(); r += 2) {
                      const int64_t b = src[r];
                      const auto pen = spec6::penalize(row_f(base, b), row_i(hist, b), rows[r].settings.penalty);
                      const float top = *std::max_element(pen.begin(), pen.end());
                      const bool unique = std::count(pen.begin(), pen.end(), top) == 1;
                      RC_CLASSIFY(!unique, "ties at the top");
                      const size_t g = rows[r].settings.temperature == 0 ? r : r + 1, k = g == r ? r + 1 : r;
                      const int64_t greedy_id = ids[static_cast<int64_t>(g)][0].item<int64_t>();
                      RC_ASSERT(pen.at(static_cast<size_t>(greedy_id)) == top);
                      for (int64_t d = 0; d < n; ++d) {
                        const int64_t id = ids[static_cast<int64_t>(k)][d].item<int64_t>();
                        RC_ASSERT(id >= 0);
                        RC_ASSERT(pen.at(static_cast<size_t>(id)) == top);
                        if (unique) RC_ASSERT(id == greedy_id);
                      }
                    }
                  }, true, true});
}

}  // namespace

std::vector<Law> generated_laws() {
  std::vector<Law> laws;
  greedy_and_top_k_laws(laws);
  top_p_laws(laws);
  penalty_laws(laws);
  temperature_laws(laws);
  spec6_model_laws(laws);
  seed_laws(laws);
  row_state_laws(laws);
  return laws;
}

double chi_square_critical(int df, double alpha) {
  double z;
  if (alpha == 1e-2) z = 2.3263;
  else if (alpha == 1e-3) z = 3.0902;
  else if (alpha == 1e-4) z = 3.7190;
  else throw std::invalid_argument("chi_square_critical: alpha must be 1e-2, 1e-3 or 1e-4");
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

namespace {

// One row of logits (1, V) on `dev`.
at::Tensor on(c10::Device dev, std::vector<float> v) { return at::tensor(v, at::kFloat).unsqueeze(0).to(dev); }

// Draws of `n` rows of `logits` under `s` (with `history` when given), seeded: the ids drawn.
std::vector<int64_t> draws(const SamplerUnderTest& sut, c10::Device dev, std::vector<float> logits, std::vector<int64_t> history,
                           const SamplingSettings& s, int64_t n, uint64_t seed) {
  at::Tensor x = on(dev, std::move(logits)).repeat({n, 1});
  at::Tensor h = history.empty() ? no_history() : at::tensor(history, at::kLong).unsqueeze(0).to(dev).repeat({n, 1});
  at::manual_seed(seed);
  at::Tensor ids = sut.pick(x, h, s).to(at::kCPU).contiguous();
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
}

int64_t count(const std::vector<int64_t>& ids, int64_t id) { return static_cast<int64_t>(std::count(ids.begin(), ids.end(), id)); }

// The seed's own self-check, shared with `tinygpt verify` and the goldens (selfcheck.cpp).
void seed_selfcheck_items(std::vector<FixedCheck>& checks) {
  // The seed's own self-check, shared with `tinygpt verify` and the goldens (selfcheck.cpp).
  static const char* names[] = {"seedSelfCheckGreedyForms", "seedSelfCheckTopFive",
                                "topPOverTheSeedDistributionDrawsExactlyTheTopTwo", "penaltyTwoOnTheSeedPairPicksTheRunnerUp"};
  for (size_t k = 0; k < 4; ++k)
    checks.push_back({names[k], "seed self-check item " + std::to_string(k),
                      [k](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                        const auto items = seed_selfcheck(sut.pick, dev);
                        return items.at(k).ok() ? "" : items.at(k).name + ": " + items.at(k).detail;
                      }});
}

// The nucleus boundary and SPEC 6's three tie rules, a row each.
void boundary_and_tie_checks(std::vector<FixedCheck>& checks) {
  checks.push_back({"topPDropsATokenWhoseMassAboveIsExactlyP",
                    "logits [0, 0], top_p 0.5: the mass above the second-ranked is exactly 0.5 >= top_p, so exactly one of the "
                    "two survives (either one: SPEC 6 leaves the order of equal scores open)",
                    [](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      // softmax([0, 0]) = [0.5, 0.5] exactly in float32: the boundary case generated cases never hit (a
                      // nucleus test of > instead of >= keeps both).
                      const auto ids = draws(sut, dev, {0.0f, 0.0f}, {}, {1.0, 0, 0.5, 1.0}, 200, 7);
                      const std::set<int64_t> seen(ids.begin(), ids.end());
                      return seen.size() == 1 ? "" : "200 draws took both ids: the second-ranked survived though the mass above it is exactly top_p";
                    }});

  // The three tie rules of SPEC 6, each a row of its own: an engine that breaks one fails that row,
  // named for what it does, and passes every other law (which leave ties open).
  checks.push_back({kTopKTieCheck,
                    "top-k keeps every token tied with the k-th: logits [1, 1, 1, 0], top_k 2, 3000 draws take all three of ids 0-2",
                    [](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      const auto ids = draws(sut, dev, {1.0f, 1.0f, 1.0f, 0.0f}, {}, {1.0, 2, 1.0, 1.0}, 3000, 11);
                      int64_t kept = 0;
                      for (int64_t id : {0, 1, 2}) kept += count(ids, id) > 0;
                      if (count(ids, 3) > 0) return "drew id 3, below the k-th score";
                      // Each tied id has probability 1/3 per draw: (2/3)^3000 says a kept one is never missed.
                      return kept == 3 ? "" : "kept exactly " + std::to_string(kept) + " of 3 tokens tied at the k-th score";
                    }});
  checks.push_back({"topPAcceptsAnyOrderAmongTiedTokens",
                    "top-p: any order among tied tokens: logits [2, 1, 1, 1, 0], top_p 0.6 keep id 0 and exactly one of the "
                    "tied ids 1-3 (whichever the implementation ranks first)",
                    [](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      // p = [.475, .175, .175, .175, .064]: the first-ranked tied token has .475 < .6 above it, the
                      // others at least .65 >= .6.
                      const auto ids = draws(sut, dev, {2.0f, 1.0f, 1.0f, 1.0f, 0.0f}, {}, {1.0, 0, 0.6, 1.0}, 3000, 13);
                      int64_t tied = 0;
                      for (int64_t id : {1, 2, 3}) tied += count(ids, id) > 0;
                      if (count(ids, 4) > 0) return "drew id 4, outside the nucleus";
                      if (count(ids, 0) == 0) return "never drew id 0, the top token";
                      return tied == 1 ? "" : "kept " + std::to_string(tied) + " of the 3 tied tokens at the nucleus boundary, expected exactly 1";
                    }});
  checks.push_back({"greedyPicksTheFirstOfEqualMaxima", "greedy: first index among equal maxima: logits [1, 3, 3, 0] at temperature 0 pick id 1",
                    [](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      const int64_t id = sut.pick(on(dev, {1.0f, 3.0f, 3.0f, 0.0f}), no_history(), {0.0, 0, 1.0, 1.0}).item<int64_t>();
                      return id == 1 ? "" : "picked id " + std::to_string(id) + " of the tied maxima {1, 2}, expected the first, 1";
                    }});

  // Every stage's direction, seen through draws alone (an engine's `sample` shows nothing else).
}

// Each stage's direction seen through draws alone, for an engine that shows nothing else.
void direction_checks(std::vector<FixedCheck>& checks) {
  checks.push_back({"penaltyLowersAPenalisedTokenWhateverItsSign",
                    "penalty 2 on a repeated token lowers its draw frequency, with a positive score (logits [1, 0], history [0]) "
                    "and with a negative one (logits [0, -1], history [1]); 4000 draws each",
                    [](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      // p(penalised) without and with the penalty: .731 -> .622 (positive), .269 -> .119 (negative); a
                      // penalty that divides the negative score raises it to .378. 4000 draws: sigma ~30 draws.
                      for (const auto& [logits, id] : {std::pair{std::vector<float>{1.0f, 0.0f}, int64_t(0)},
                                                       std::pair{std::vector<float>{0.0f, -1.0f}, int64_t(1)}}) {
                        const int64_t without = count(draws(sut, dev, logits, {}, {1.0, 0, 1.0, 1.0}, 4000, 17), id);
                        const int64_t with = count(draws(sut, dev, logits, {id}, {1.0, 0, 1.0, 2.0}, 4000, 19), id);
                        if (with >= without - 150)
                          return std::string("the penalty did not lower a repeated token with a ") + (logits[id] > 0 ? "positive" : "negative") +
                                 " score: drawn " + std::to_string(with) + " of 4000 times with it, " + std::to_string(without) + " without" +
                                 (logits[id] < 0 && with > without ? " (it raised it: a negative score divided instead of multiplied)" : "");
                      }
                      return "";
                    }});
  checks.push_back({"temperatureSharpensBelowOneAndFlattensAboveOne",
                    "logits [2, 1, 0, -1]: the top token's draw frequency at T 0.5 > at T 1 > at T 2; 4000 draws each",
                    [](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      // p(top) = .865, .644, .455 at T = 0.5, 1, 2: ~9 sigma apart at 4000 draws.
                      int64_t last = 4001;
                      for (double t : {0.5, 1.0, 2.0}) {
                        const int64_t n = count(draws(sut, dev, {2.0f, 1.0f, 0.0f, -1.0f}, {}, {t, 0, 1.0, 1.0}, 4000, 23), 0);
                        if (n >= last - 150)
                          return "the top token was drawn " + std::to_string(n) + " of 4000 times at temperature " + std::to_string(t).substr(0, 3) +
                                 ", not fewer than at the lower temperature (" + std::to_string(last) + ")";
                        last = n;
                      }
                      return "";
                    }});
  checks.push_back({"topKAndTopPNeverWidenTheSupport",
                    "logits [3, 2, 1, 0, -1, -2]: top_k 3 draws only ids 0-2, top_p 0.8 only its nucleus {0, 1}, both only their "
                    "intersection; 2000 draws each",
                    [](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      // p = [.634, .233, .086, .032, .012, .004]: the nucleus of 0.8 is {0, 1} (.634 < .8 <= .867).
                      const std::vector<float> x = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f};
                      for (const auto& [s, allowed] : {std::pair{SamplingSettings{1.0, 3, 1.0, 1.0}, int64_t(2)},
                                                       std::pair{SamplingSettings{1.0, 0, 0.8, 1.0}, int64_t(1)},
                                                       std::pair{SamplingSettings{1.0, 4, 0.8, 1.0}, int64_t(1)}})
                        for (int64_t id : draws(sut, dev, x, {}, s, 2000, 29))
                          if (id > allowed)
                            return "drew id " + std::to_string(id) + " with " + s.to_string() + ": outside ids 0-" + std::to_string(allowed);
                      return "";
                    }});
}

// The whole distribution: a chi-square test of draws with every stage active.
void distribution_checks(std::vector<FixedCheck>& checks) {
  checks.push_back({"drawsMatchTheSpec6Distribution",
                    "chi-square(20000 draws vs the SPEC 6 model's p, every stage active) below the 1e-3 false-alarm critical value",
                    [](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      const int64_t N = 20000;
                      const std::vector<float> logits = {2.0f, 1.6f, 1.3f, 1.0f, 0.8f, 0.5f, 0.3f, 0.1f, -0.2f, -0.5f, -1.0f, -2.0f};
                      const std::vector<int64_t> hist = {0, 3, 3, 9};
                      at::Tensor x = on(dev, logits);
                      at::Tensor h = at::tensor(hist, at::kLong).unsqueeze(0).to(dev);
                      const SamplingSettings s{0.9, 8, 0.9, 1.3};
                      // Expected probabilities from the plain model, not the code under trial.
                      const auto m = spec6::filter(logits, hist, {s.temperature, s.top_k, s.top_p, s.penalty}, kNucleusSlack);
                      std::vector<bool> support(m.fate.size());
                      for (size_t i = 0; i < support.size(); ++i) {
                        if (m.fate[i] == spec6::Fate::Either) return "the fixed case sits on the nucleus boundary: choose another";
                        support[i] = m.fate[i] == spec6::Fate::Kept;
                      }
                      const auto p = spec6::distribution(m.scores, support);
                      at::manual_seed(12345);
                      at::Tensor ids = sut.pick(x.repeat({N, 1}), h.repeat({N, 1}), s).to(at::kCPU);
                      std::vector<double> count(p.size(), 0);
                      for (int64_t i = 0; i < N; ++i) count[ids[i].item<int64_t>()] += 1;
                      double chi2 = 0;
                      int cats = 0;
                      for (size_t i = 0; i < p.size(); ++i) {
                        if (p[i] == 0) {
                          if (count[i] > 0) return "drew id " + std::to_string(i) + " whose filtered p is 0";
                          continue;
                        }
                        ++cats;
                        const double e = N * p[i];
                        chi2 += (count[i] - e) * (count[i] - e) / e;
                      }
                      const double crit = chi_square_critical(cats - 1, 1e-3);
                      if (chi2 > crit) {
                        std::ostringstream m;
                        m << "chi-square " << chi2 << " > critical " << crit << " (df " << cats - 1 << ")";
                        return m.str();
                      }
                      return "";
                    }});
}

}  // namespace

std::vector<FixedCheck> fixed_checks() {
  std::vector<FixedCheck> checks;
  seed_selfcheck_items(checks);
  boundary_and_tie_checks(checks);
  direction_checks(checks);
  distribution_checks(checks);
  return checks;
}

}  // namespace tinygpt::props
