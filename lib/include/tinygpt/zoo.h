// The zoo's members by name (SPEC 10): small configs of the architectures engines serve,
// each one knob set at a time away from the seed's so a fault at a boundary has a member that carries
// the feature. Same vocabulary and context as the seed (4096 tokens, 256 positions), d_model 128-192,
// 2-4 layers, so each trains in minutes on the KJV corpus (ci/make-zoo.sh).
#pragma once

#include <string>
#include <vector>

#include "tinygpt/config.h"

namespace tinygpt {

// llama, mqa, mistral, gemma2, qwen3, neox - in that order.
const std::vector<std::string>& zoo_names();
// The member's config; std::invalid_argument naming the members for an unknown name.
Config zoo_config(const std::string& name);

// The fixture's speculative draft (speculative.h, golden/draft.safetensors): the seed's architecture at
// d_model 128 and 2 layers (about 0.9M parameters, 4,096 tokens, 256 positions), so it shares the
// fixture's tokenizer and runs on every cache and kernel the seed's does. `train --arch draft`.
Config draft_config();

}  // namespace tinygpt
