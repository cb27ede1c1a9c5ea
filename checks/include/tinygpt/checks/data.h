// Where the shipped fixture (fixture.safetensors, tokenizer.json) and its goldens are. An installed
// `tinygpt` finds them beside itself; a program linking tinygpt::checks, through the path its CMake
// package recorded; a build tree, in the sources it was built from.
#pragma once

#include <string>

namespace tinygpt::checks {

// The first folder holding fixture.safetensors, of: $TINYGPT_DATA_DIR; <the running program's
// folder>/../share/tinygpt/golden; the folder set_data_dir_hint() named; the source tree's golden/.
// Throws std::runtime_error naming every place tried.
std::string data_dir();

// The engine adapters and the ONNX export script: $TINYGPT_ENGINES_DIR; <program folder>/../share/tinygpt/
// engines; the source tree's engines/. Throws std::runtime_error naming every place tried.
std::string engines_dir();

// A folder to try before the source tree (the conformance kit passes the installed package's).
void set_data_dir_hint(const std::string& dir);

}  // namespace tinygpt::checks
