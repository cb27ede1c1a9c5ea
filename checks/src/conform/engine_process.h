// A child process that speaks `tinygpt conform`'s line protocol: started through /bin/sh -c in a
// process group of its own, one JSON object per line on its stdin and stdout, its stderr passed
// through. Every failure to talk to it (it will not start, dies, answers something that is not one
// JSON object, or is silent past the timeout) throws EngineUnusable, which `conform` maps to exit
// 2; an `ok: false` answer is returned for the caller to judge. The destructor always ends the
// child: `quit`, a short grace period, then SIGKILL to its group, and reaps it (no zombies).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "tinygpt/checks/engine_unusable.h"

namespace tinygpt::checks {

// Text an engine sent, made safe for a terminal and for every report: invalid UTF-8, the
// non-characters U+FFFE and U+FFFF, and control characters other than tab written as "\xNN" (so an
// escape sequence prints as text, never as a command to the terminal), and cut at a character
// boundary to at most `max_bytes` bytes, "..." marking the cut.
std::string engine_text(const std::string& s, size_t max_bytes = 200);
// A JSON value an engine sent, as engine_text of its compact dump.
std::string engine_json(const nlohmann::json& j, size_t max_bytes = 200);

// One JSON text, exactly as nlohmann::json::parse reads it (the same values, integers as integers,
// the same texts refused: a discarded value for those), its numbers read by std::from_chars: an
// answer's logits are most of what the suite parses (a few MB a request), and the library's strtod
// took about 40% of conform's time. Strings go through nlohmann itself (escapes, UTF-8 checks).
nlohmann::json parse_json_fast(const std::string& text);

// Parses one response line: a JSON object with a boolean "ok", and a string "error" when ok is
// false. Throws EngineUnusable naming the request otherwise. (Kept apart so it can be fuzzed.)
nlohmann::json parse_response(const std::string& line, const std::string& op);

class EngineProcess {
 public:
  EngineProcess(const std::string& command, double timeout_s);
  ~EngineProcess();
  EngineProcess(const EngineProcess&) = delete;
  EngineProcess& operator=(const EngineProcess&) = delete;

  // Sends `request` and returns the engine's one-line answer, parsed.
  nlohmann::json call(const nlohmann::json& request);
  // Sends quit and waits (up to the timeout) for a clean exit; true when it exited 0.
  bool quit();
  int64_t requests() const { return requests_; }
  double bytes_sent() const { return sent_; }

 private:
  void write_all(const std::string& s, const std::string& op);
  std::string read_line(const std::string& op);
  // One read into the buffer: false at end of output. Throws EngineUnusable past the line cap.
  bool read_some(const std::string& op);
  // Reads and discards what the engine writes, waiting up to `wait` for it (quit and shutdown).
  void drain_output(std::chrono::milliseconds wait);
  void kill_and_reap();
  // After a closed pipe: "it exited with status N" / "it was killed by signal N" once the child is
  // reaped (waiting up to 1 s), else `otherwise`.
  std::string how_it_ended(const std::string& otherwise);

  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  double timeout_s_;
  std::string buffer_;
  size_t scanned_ = 0;  // buffer_[0, scanned_) holds no newline
  size_t partial_ = 0;  // bytes after the buffer's last newline: the line being read
  int64_t requests_ = 0;
  double sent_ = 0;
};

}  // namespace tinygpt::checks
