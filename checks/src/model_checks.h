// Pieces the rows of the check table share (model_checks.cpp, serving_checks.cpp). Private.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "tinygpt/checks/check_suite.h"

namespace tinygpt::checks {

// Sets the row's verdict (pass or fail) and its detail.
void set_result(CheckResult& r, bool ok, std::string detail);
// A run's logits (B, n, V) against its references, full inside the window and banded every step, at
// the bounds in force; fills `r` (verdict, detail, statistics) and returns the banded comparison.
StepDiffs judge_row(CheckResult& r, const Tolerances& t, const at::Tensor& logits, const StepReference& ref, int64_t prompt_len);
// The serving rows: ragged, join-leave, fork, rollback, batch-sizes.
std::vector<CheckDef> serving_check_rows();

}  // namespace tinygpt::checks
