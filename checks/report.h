// JSON views of the harness's result structs (schemas documented in the README).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "equivalence.h"
#include "inject.h"

namespace tinygpt::checks {

nlohmann::json to_json(const EquivalenceResult& r);
nlohmann::json to_json(const InjectionReport& r);

// Writes `doc` to `path` through a temporary file renamed into place: never a half-written file.
void write_json_atomically(const std::string& path, const nlohmann::json& doc);

}  // namespace tinygpt::checks
