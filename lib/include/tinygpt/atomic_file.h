// Every file the tool writes goes through here: written to a temporary file beside the target
// (PATH.tmp.PID), flushed to the disk, then renamed into place, so a failure or a kill at any
// moment leaves the old file or the new one, never a torn one (tests/kill/kill_writes.py kills
// golden update, convert and train mid-write). Temporary files of writers that were killed are
// removed by the next write to the same path.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace tinygpt {

// Calls body(stream) on a temporary file, then renames it onto `path`. Throws
// std::runtime_error naming `path`; the temporary file is removed on any failure.
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& body);

// The one text writer: `text` to `path`, atomically.
void write_text_atomically(const std::string& path, const std::string& text);

// For writers that open the file themselves: fill(temporary_path), then rename onto `path`.
void write_atomically_via(const std::string& path, const std::function<void(const std::string&)>& fill);

}  // namespace tinygpt
