#include "tinygpt/laws/spec6_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

namespace tinygpt::props::spec6 {

std::vector<float> penalize(std::vector<float> s, const std::vector<int64_t>& history, double penalty) {
  if (penalty == 1.0) return s;
  const float p = static_cast<float>(penalty);
  for (int64_t id : std::set<int64_t>(history.begin(), history.end()))
    s[id] = s[id] > 0 ? s[id] / p : s[id] * p;  // both push the token down (for penalty > 1)
  return s;
}

std::vector<float> scale(std::vector<float> s, double temperature) {
  const float t = static_cast<float>(temperature);
  for (float& v : s) v = v / t;
  return s;
}

std::vector<bool> top_k(const std::vector<float>& s, int64_t k) {
  std::vector<bool> alive(s.size(), true);
  if (k == 0) return alive;
  std::vector<float> sorted = s;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  const float kth = sorted[static_cast<size_t>(k - 1)];
  for (size_t i = 0; i < s.size(); ++i) alive[i] = s[i] >= kth;
  return alive;
}

std::vector<Fate> top_p(const std::vector<float>& s, const std::vector<bool>& alive, double top_p, double slack) {
  std::vector<Fate> fate(s.size());
  for (size_t i = 0; i < s.size(); ++i) fate[i] = alive[i] ? Fate::Kept : Fate::Dropped;
  if (top_p >= 1.0) return fate;
  const std::vector<double> p = distribution(s, alive);
  std::vector<size_t> rank(s.size());
  std::iota(rank.begin(), rank.end(), 0);
  std::stable_sort(rank.begin(), rank.end(), [&](size_t a, size_t b) {
    const float x = alive[a] ? s[a] : -INFINITY, y = alive[b] ? s[b] : -INFINITY;
    return x > y;
  });
  double above = 0;  // mass of the tokens ranked above
  for (size_t r = 0; r < rank.size(); ++r) {
    const size_t i = rank[r];
    if (r > 0 && alive[i]) {
      if (above >= top_p + slack) fate[i] = Fate::Dropped;
      else if (above >= top_p - slack) fate[i] = Fate::Either;
    }
    above += p[i];
  }
  // A group of equal scores whose members did not all meet the same fate straddles the boundary: in
  // another order among them, any one of them could have been the one ranked first.
  for (size_t r = 0; r < rank.size();) {
    size_t e = r;
    while (e < rank.size() && alive[rank[e]] && alive[rank[r]] && s[rank[e]] == s[rank[r]]) ++e;
    if (e == r) {
      ++r;
      continue;
    }
    bool mixed = false;
    for (size_t j = r; j < e; ++j) mixed |= fate[rank[j]] != fate[rank[r]] || fate[rank[j]] == Fate::Either;
    if (mixed)
      for (size_t j = r; j < e; ++j) fate[rank[j]] = Fate::Either;
    r = e;
  }
  return fate;
}

Filtered filter(const std::vector<float>& logits, const std::vector<int64_t>& history, const Settings& s, double slack,
                bool ties_at_k_either) {
  Filtered f;
  f.scores = scale(penalize(logits, history, s.penalty), s.temperature);
  f.fate = top_p(f.scores, top_k(f.scores, s.top_k), s.top_p, slack);
  if (ties_at_k_either && s.top_k > 0 && s.top_k < static_cast<int64_t>(f.scores.size())) {
    std::vector<float> sorted = f.scores;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const float kth = sorted[static_cast<size_t>(s.top_k - 1)];
    // Only a tie that crosses the cut (the k-th score also below rank k) leaves room for a choice.
    if (sorted[static_cast<size_t>(s.top_k)] == kth)
      for (size_t i = 0; i < f.scores.size(); ++i)
        if (f.scores[i] == kth) f.fate[i] = Fate::Either;
  }
  return f;
}

std::vector<double> distribution(const std::vector<float>& scores, const std::vector<bool>& support) {
  double m = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < scores.size(); ++i)
    if (support[i]) m = std::max(m, static_cast<double>(scores[i]));
  std::vector<double> p(scores.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < scores.size(); ++i)
    if (support[i] && scores[i] > -INFINITY) z += (p[i] = std::exp(static_cast<double>(scores[i]) - m));
  for (double& v : p) v /= z;
  return p;
}

int64_t greedy(const std::vector<float>& logits, const std::vector<int64_t>& history, double penalty) {
  const std::vector<float> s = penalize(logits, history, penalty);
  return std::max_element(s.begin(), s.end()) - s.begin();  // the first of equal maxima
}

}  // namespace tinygpt::props::spec6
