// The sampler's laws (SPEC 6), each named for what it states. Generated laws are RapidCheck
// properties (inline generators, RC_ASSERT); fixed checks are the seed's own examples and the
// chi-square test. Both take the sampler under test and a device, so one suite covers CPU, CUDA
// and every planted bug.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <vector>

#include "tinygpt/laws/sampler_under_test.h"

namespace tinygpt::props {

struct Law {
  std::string name;     // the law, camelCase
  std::string formula;  // the law as a formula
  std::function<void(const SamplerUnderTest&, c10::Device)> body;  // RapidCheck property body
  // Uses only `pick` (draws), never `filtered`: it also holds for a sampler seen only through its
  // draws, such as an engine driven by `tinygpt conform`.
  bool pick_only = false;
  // Draws a batch whose rows carry their own settings and seeds (SamplerUnderTest::pick_rows): a
  // sampler without per-row state skips it.
  bool rows = false;
};
std::vector<Law> generated_laws();

// Fixed checks use only `pick`.
struct FixedCheck {
  std::string name;
  std::string formula;
  // Returns "" when the check holds, else what went wrong.
  std::function<std::string(const SamplerUnderTest&, c10::Device)> run;
};
std::vector<FixedCheck> fixed_checks();
// The fixed check of SPEC 6's top-k tie rule (an engine that keeps exactly k declares it broken).
inline constexpr const char kTopKTieCheck[] = "topKDrawsEveryTokenTiedWithTheKth";

// Upper critical value of chi-square with `df` degrees of freedom at false-alarm rate `alpha`
// (Wilson-Hilferty approximation; alpha in {1e-2, 1e-3, 1e-4}).
double chi_square_critical(int df, double alpha);

}  // namespace tinygpt::props
