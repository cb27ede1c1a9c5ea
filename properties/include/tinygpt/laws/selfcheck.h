// The seed's sampler self-check (SPEC 6), against any pick function, so `tinygpt verify`, the
// goldens, the property suite and `tinygpt conform` run the same four items: temperature 0, top_k=1
// and top_p=1e-9 equal argmax; top_k=5 never leaves the top 5 (200 draws); top_p=0.75 over
// [0.5, 0.3, 0.15, 0.05] draws only {0, 1}, both (500 draws); penalty 2.0 on [2.0, 1.5] with
// history [0] at temperature 0 picks 1.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "tinygpt/results/result.h"
#include "tinygpt/laws/sampler_under_test.h"

namespace tinygpt::props {

// One row per item; a pick that throws makes its item an error. `draws`, when given, receives each
// item's drawn ids (for the goldens).
std::vector<results::CheckResult> seed_selfcheck(const ScoreFn& pick, c10::Device device,
                                                std::vector<std::vector<int64_t>>* draws = nullptr);

}  // namespace tinygpt::props
