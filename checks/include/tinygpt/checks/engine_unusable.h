// The one error of talking to an engine at all, apart from what the engine answers: the conform driver
// (conform.h), the engine's process (its line protocol) and a reproduction's replay (repro.h) throw it,
// and the command line maps it to exit 2.
#pragma once

#include <stdexcept>

namespace tinygpt::checks {

// The engine cannot be run at all: it does not start, dies, answers something that is not one
// JSON object, is silent past the timeout, or fails `hello` or `load`. The command line maps it to
// exit 2. (An `ok: false` answer to a valid request is the engine being wrong: a failed check.)
struct EngineUnusable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace tinygpt::checks
