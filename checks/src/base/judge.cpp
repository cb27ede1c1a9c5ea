#include "tinygpt/checks/judge.h"

#include <cstdio>

#include "tinygpt/results/result.h"

namespace tinygpt::checks {

namespace {

std::string percent(double share) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * share);
  return b;
}

std::string position(const StepDiffs& d, size_t i) { return std::to_string(d.first_position + static_cast<int64_t>(i)); }

}  // namespace

Verdict judge(const StepDiffs& d, const Tolerances& t, double max_diff) {
  using results::sci;
  Verdict v;
  if (!t.by_distribution()) {
    v.bound = "max |diff| <= " + sci(max_diff);
    for (size_t i = 0; i < d.diffs.size(); ++i)
      if (!(d.diffs[i] <= max_diff)) {  // NaN is over
        v.ok = false;
        v.first_over = i;
        v.at_first_over = d.diffs[i];
        v.why = "first over " + sci(max_diff) + " at position " + position(d, i) + " (|diff| " + sci(d.diffs[i]) + ")";
        break;
      }
    return v;
  }
  std::string why;
  if (t.max_kl) {
    v.bound = "mean KL <= " + sci(*t.max_kl);
    if (const auto over = d.first_kl_over(*t.max_kl)) {  // where the drift starts, pass or fail
      v.first_over = *over;
      v.at_first_over = d.kl[*over];
      v.by_kl = true;
    }
    const double mean = d.kl_mean();
    if (!(mean <= *t.max_kl)) {
      v.ok = false;
      why = "mean KL " + sci(mean) + " > " + sci(*t.max_kl) +
            (v.first_over ? ", first step over it at position " + position(d, *v.first_over) + " (KL " + sci(v.at_first_over) + ")" : "");
    }
  }
  if (t.min_top1) {
    char b[48];
    std::snprintf(b, sizeof b, "top-1 agreement >= %.4g", *t.min_top1);
    v.bound += (v.bound.empty() ? "" : ", ") + std::string(b);
    const double share = d.top1_agreement();
    if (!(share >= *t.min_top1)) {
      v.ok = false;
      why += (why.empty() ? "" : "; ") + std::string("top-1 agreement ") + percent(share) + " < " + percent(*t.min_top1) +
             (d.first_top1_parting ? " (argmax first parts at position " + std::to_string(*d.first_top1_parting) + ")" : "");
    }
  }
  v.why = why;
  return v;
}

}  // namespace tinygpt::checks
