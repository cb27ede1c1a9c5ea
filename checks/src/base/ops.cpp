#include "tinygpt/checks/ops.h"

namespace tinygpt::checks {

namespace {
constexpr const char* kNames[kOpCount] = {"ragged", "join",     "fork",     "truncate",       "extend",       "save",
                                          "shift",  "threads",  "generate", "generate-shift", "row-sampling", "bench",
                                          "speculate"};
}  // namespace

const char* op_name(Op op) { return kNames[static_cast<unsigned>(op)]; }

std::optional<Op> op_named(const std::string& name) {
  for (unsigned i = 0; i < kOpCount; ++i)
    if (name == kNames[i]) return static_cast<Op>(i);
  return std::nullopt;
}

std::string Ops::names(const char* sep) const {
  std::string s;
  each([&](Op o) { s += (s.empty() ? "" : sep) + std::string(op_name(o)); });
  return s;
}

}  // namespace tinygpt::checks
