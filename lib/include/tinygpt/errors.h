// The error a user can fix by changing what they gave us: a file that is not what it claims (a
// checkpoint, safetensors, tokenizer or golden file), or an output path that cannot be written.
// The command line maps it to exit 2, like a bad argument (std::invalid_argument); every other
// std::runtime_error is exit 3.
#pragma once

#include <stdexcept>

namespace tinygpt {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace tinygpt
