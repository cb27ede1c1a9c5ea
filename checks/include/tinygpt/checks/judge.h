// The one judge: how a comparison of a target's logits with a reference becomes a verdict. Every row
// of the check table, conform's KV budget and verify's budgeted caches call judge(), so a bound means
// the same on every row and in every command: by default the largest |diff| against the tolerance;
// with a mean-KL bound (--max-kl, a declared deviation's, a KV cache's budget) and/or a top-1 bound
// (--min-top1) those instead, the |diff| then only reported. A declared deviation widens the
// Tolerances before they reach here (CheckContext::bound_for).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "tinygpt/checks/reference.h"

namespace tinygpt::checks {

// The bounds a comparison is judged by. `logits` is max |diff| against our reference model; `self` is
// max |diff| of the target's cached step against its own prefill of the same tokens (both paths share
// every approximation the target makes, so only the cache can part them).
struct Tolerances {
  double logits = kLogitTolerance;
  double self = kSelfTolerance;
  std::optional<double> max_kl;    // gate on mean KL(reference || target) per step instead of max |diff|
  std::optional<double> min_top1;  // gate on the share of steps whose argmax agrees
  std::string why;                 // how `logits` was chosen, where not kLogitTolerance (reports say it)
  // Judged by the distribution (mean KL, top-1) rather than by the |diff| bound.
  bool by_distribution() const { return max_kl.has_value() || min_top1.has_value(); }
};

// What judge() decided about one comparison.
struct Verdict {
  bool ok = true;
  std::string bound;  // what judged it: "max |diff| <= 1.00e-04", "mean KL <= 3.00e-05, top-1 agreement >= 0.95"
  // The first step over the bound that judged it, when one is: over the |diff| bound, or (judged by
  // the distribution) the first step whose own KL is over the mean-KL bound (where the drift starts).
  std::optional<size_t> first_over;
  double at_first_over = 0;   // that step's |diff|, or its KL
  bool by_kl = false;         // first_over is a step's KL, not its |diff|
  // "first over 1.00e-04 at position 257 (|diff| 3.1e-02)" / "mean KL 4.1e-04 > 3.00e-05, first step
  // over it at position 40 (KL 2.2e-03)" / "top-1 agreement 93.0% < 95.0%": why it failed, or "".
  std::string why;
};

// `d` (steps at positions d.first_position + i) against the bounds `t`, its |diff| bound `max_diff`
// (t.logits for the reference rows, t.self for self): the distribution's bounds when t has one, else
// the |diff| bound. A NaN is over every bound.
Verdict judge(const StepDiffs& d, const Tolerances& t, double max_diff);
// The reference rows' judge: the |diff| bound is t.logits.
inline Verdict judge(const StepDiffs& d, const Tolerances& t) { return judge(d, t, t.logits); }

}  // namespace tinygpt::checks
