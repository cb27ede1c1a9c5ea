// The conform protocol reader: one engine answer line, as `tinygpt conform` parses it.
#include <string>

#include "engine_process.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  try {
    tinygpt::checks::parse_response(line, "step");
  } catch (const tinygpt::checks::EngineUnusable&) {
  }
  return 0;
}
