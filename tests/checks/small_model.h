// The harness tests' model: small enough that the whole fault matrix runs in seconds, with a
// 32-token window so 2.5 windows are cheap.
#pragma once

#include "tinygpt/config.h"

namespace tinygpt::checks {

inline Config small_config() {
  Config c;
  c.vocab_size = 256;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_layers = 2;
  c.context = 32;
  return c;
}

}  // namespace tinygpt::checks
