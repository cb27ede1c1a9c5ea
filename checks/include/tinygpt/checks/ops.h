// The serving operations a row drives and a target offers: one vocabulary for the check table
// (CheckDef::ops), the targets (DecodeTarget::unsupported), churn's plan and the conform protocol,
// whose names (hello's "operations", docs/protocol.md) are op_name's.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

namespace tinygpt::checks {

enum class Op : unsigned {
  Ragged,         // prefill rows of different lengths together (protocol 2)
  Join,           // rows admitted and released while others run
  Fork,           // a new row continuing from another
  Truncate,       // drop a row's newest tokens (a rejected draft)
  Extend,         // several tokens appended to a row in one request (protocol 3)
  Save,           // a row's state as a value, and a row restored from one
  Shift,          // a context shift: entries dropped after the first `keep`, the later ones renumbered
  Threads,        // the threads the target computes with
  Generate,       // whole requests the target schedules itself
  GenerateShift,  // ... past the window, shifting their context as llama-server does
  RowSampling,    // `sample` with each row's own settings and seed
  Bench,          // the engine's own timed decode loop
  Speculate,      // a sequence decoded by drafting and verifying (speculative.h): the engine's own machinery
};
inline constexpr unsigned kOpCount = static_cast<unsigned>(Op::Speculate) + 1;

// The protocol's name of an operation ("ragged", "generate-shift", ...), and the operation of a name.
const char* op_name(Op op);
std::optional<Op> op_named(const std::string& name);

// A set of operations (a row's needs, a target's offer).
class Ops {
 public:
  constexpr Ops() = default;
  constexpr Ops(std::initializer_list<Op> ops) {
    for (Op o : ops) bits_ |= bit(o);
  }
  constexpr bool has(Op o) const { return (bits_ & bit(o)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr Ops with(Op o) const { Ops s = *this; s.bits_ |= bit(o); return s; }
  constexpr bool operator==(const Ops& o) const { return bits_ == o.bits_; }
  // "ragged,join" in the enum's order, joined by `sep` ("" when empty).
  std::string names(const char* sep = ",") const;
  template <class F>
  void each(F f) const {
    for (unsigned i = 0; i < kOpCount; ++i)
      if (bits_ & (1u << i)) f(static_cast<Op>(i));
  }

 private:
  static constexpr unsigned bit(Op o) { return 1u << static_cast<unsigned>(o); }
  unsigned bits_ = 0;
};

}  // namespace tinygpt::checks
