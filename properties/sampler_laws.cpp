#include "sampler_laws.h"

#include "selfcheck.h"

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

}  // namespace

std::vector<Law> generated_laws() {
  std::vector<Law> laws;

  laws.push_back({"temperatureZeroIsArgmax", "pick(T=0) == first index of max(logits)",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor ids = sut.pick(x, no_history(), {0.0, 0, 1.0, 1.0}).to(at::kCPU);
                    for (int64_t b = 0; b < x.size(0); ++b) {
                      auto s = row(x, b);
                      const int64_t first = std::max_element(s.begin(), s.end()) - s.begin();
                      RC_ASSERT(ids[b].item<int64_t>() == first);
                    }
                  }});

  laws.push_back({"topKOnePicksATopScoringToken", "pick(top_k=1, any T > 0, any top_p) in argmax set",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    at::Tensor ids = sut.pick(x, no_history(), {gen_temperature(), 1, gen_top_p(), 1.0}).to(at::kCPU);
                    for (int64_t b = 0; b < x.size(0); ++b) RC_ASSERT(in_max_set(row(x, b), ids[b].item<int64_t>()));
                  }});

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
                  }});

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
                  }});

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

  laws.push_back({"theSameSeedGivesTheSameDraws", "seed(s); pick == seed(s); pick",
                  [](const SamplerUnderTest& sut, c10::Device dev) {
                    at::Tensor x = gen_logits(dev);
                    const SamplingSettings s{gen_temperature(), 0, gen_top_p(), 1.0};
                    const auto seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
                    at::manual_seed(seed);
                    at::Tensor a = sut.pick(x, no_history(), s);
                    at::manual_seed(seed);
                    RC_ASSERT(a.equal(sut.pick(x, no_history(), s)));
                  }});
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

std::vector<FixedCheck> fixed_checks() {
  std::vector<FixedCheck> checks;
  auto on = [](c10::Device dev, std::vector<float> v) { return at::tensor(v, at::kFloat).unsqueeze(0).to(dev); };

  // The seed's own self-check, shared with `tinygpt verify` (checks/selfcheck.cpp).
  static const char* names[] = {"seedSelfCheckGreedyForms", "seedSelfCheckTopFive",
                                "topPOverTheSeedDistributionDrawsExactlyTheTopTwo", "penaltyTwoOnTheSeedPairPicksTheRunnerUp"};
  for (size_t k = 0; k < 4; ++k)
    checks.push_back({names[k], "seed self-check item " + std::to_string(k),
                      [k](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                        const auto items = checks::sampler_selfcheck(
                            [&](const at::Tensor& l, const at::Tensor& h, const SamplingSettings& s) { return sut.pick(l, h, s); },
                            dev);
                        return items.at(k).passed ? "" : items.at(k).name + ": " + items.at(k).detail;
                      }});

  checks.push_back({"drawsMatchTheFilteredDistribution",
                    "chi-square(20000 draws vs filtered p) below the 1e-3 false-alarm critical value",
                    [on](const SamplerUnderTest& sut, c10::Device dev) -> std::string {
                      const int64_t N = 20000;
                      at::Tensor x = on(dev, {2.0f, 1.6f, 1.3f, 1.0f, 0.8f, 0.5f, 0.3f, 0.1f, -0.2f, -0.5f, -1.0f, -2.0f});
                      const SamplingSettings s{0.9, 8, 0.95, 1.0};
                      // Expected probabilities from the production filter: the draw stage is on trial.
                      auto p = row(filtered_probs(x, {}, s), 0);
                      at::manual_seed(12345);
                      at::Tensor ids = sut.pick(x.repeat({N, 1}), {}, s).to(at::kCPU);
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
  return checks;
}

}  // namespace tinygpt::props
