// The harness's rows are the results layer's (tinygpt/results/result.h): its type, verdicts and
// printers, named in the harness without a prefix.
#pragma once

#include "tinygpt/results/result.h"

namespace tinygpt::checks {
using namespace tinygpt::results;
}  // namespace tinygpt::checks
