// Every file the tool writes goes through here: written to a temporary file beside the target,
// then renamed into place, so a failure never leaves a half-written file.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace tinygpt {

// Calls body(stream) on a temporary file, then renames it onto `path`. Throws
// std::runtime_error naming `path`; the temporary file is removed on any failure.
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& body);

// For writers that open the file themselves: fill(temporary_path), then rename onto `path`.
void write_atomically_via(const std::string& path, const std::function<void(const std::string&)>& fill);

}  // namespace tinygpt
