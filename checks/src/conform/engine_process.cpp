#include "engine_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace tinygpt::checks {

std::string engine_text(const std::string& s, size_t max_bytes) {
  std::string out;
  auto hex = [&](unsigned char c) {
    static const char* digits = "0123456789abcdef";
    out += "\\x";
    out += digits[c >> 4];
    out += digits[c & 15];
  };
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    // The length of a well-formed UTF-8 sequence starting here (0: not one).
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; n && k < n; ++k) {
      if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) >> 6) != 2) n = 0;
      else cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    }
    // Overlong forms, surrogates, values past U+10FFFF and the non-characters are not text.
    if (n && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
              (cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe || cp == 0xffff))
      n = 0;
    const size_t before = out.size();
    if (n == 0) hex(c), n = 1;
    else if (n == 1 && (c < 0x20 || c == 0x7f) && c != '\t') hex(c);
    else out.append(s, i, n);
    if (out.size() > max_bytes) {
      out.resize(before);
      return out + "...";
    }
    i += n;
  }
  return out;
}

namespace {
std::string clip(const std::string& s) { return engine_text(s, 200); }
}  // namespace

nlohmann::json parse_response(const std::string& line, const std::string& op) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw EngineUnusable("engine: the answer to '" + op + "' is not JSON: " + clip(line));
  if (!j.is_object()) throw EngineUnusable("engine: the answer to '" + op + "' is not a JSON object: " + clip(line));
  if (!j.contains("ok") || !j["ok"].is_boolean())
    throw EngineUnusable("engine: the answer to '" + op + "' has no boolean \"ok\": " + clip(line));
  if (!j["ok"].get<bool>() && !(j.contains("error") && j["error"].is_string()))
    throw EngineUnusable("engine: the answer to '" + op + "' has ok false and no \"error\" string: " + clip(line));
  return j;
}

EngineProcess::EngineProcess(const std::string& command, double timeout_s) : timeout_s_(timeout_s) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
    throw EngineUnusable(std::string("engine: cannot create pipes: ") + std::strerror(errno));
  pid_ = fork();
  if (pid_ < 0) throw EngineUnusable(std::string("engine: cannot fork: ") + std::strerror(errno));
  if (pid_ == 0) {  // the child: its own group, so ending it ends whatever the shell started
    setpgid(0, 0);
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    signal(SIGPIPE, SIG_DFL);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid_, pid_);  // also here: no race with the child's own call
  close(in[0]);
  close(out[1]);
  to_child_ = in[1];
  from_child_ = out[0];
  signal(SIGPIPE, SIG_IGN);  // a dead engine is an error we report, not a signal that kills us
}

EngineProcess::~EngineProcess() { kill_and_reap(); }

std::string EngineProcess::how_it_ended(const std::string& otherwise) {
  // A closed pipe usually means the engine is exiting: give it a moment, so the message says how
  // (a write can fail before the exit is reaped as easily as a read).
  for (int i = 0; i < 100 && pid_ > 0; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? "it exited with status " + std::to_string(WEXITSTATUS(status))
                               : "it was killed by signal " + std::to_string(WTERMSIG(status));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return otherwise;
}

void EngineProcess::kill_and_reap() {
  if (to_child_ >= 0) close(to_child_), to_child_ = -1;
  if (from_child_ >= 0) close(from_child_), from_child_ = -1;
  if (pid_ <= 0) return;
  int status = 0;
  for (int i = 0; i < 20; ++i) {  // closed stdin: a well-behaved engine exits; give it 200 ms
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      kill(-pid_, SIGKILL);  // anything the shell left behind in the group
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(-pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

void EngineProcess::write_all(const std::string& s, const std::string& op) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(to_child_, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw EngineUnusable("engine: no answer to '" + op + "': " + how_it_ended("it closed its input"));
    done += static_cast<size_t>(n);
  }
  sent_ += static_cast<double>(s.size());
}

std::string EngineProcess::read_line(const std::string& op) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s_);
  for (;;) {
    if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const double left = std::chrono::duration<double>(deadline - clock::now()).count();
    if (left <= 0)
      throw EngineUnusable("engine: no answer to '" + op + "' within " + std::to_string(int(timeout_s_)) + " s (--timeout)");
    pollfd p{from_child_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (r < 0 && errno != EINTR) throw EngineUnusable(std::string("engine: poll failed: ") + std::strerror(errno));
    if (r <= 0) continue;
    char chunk[65536];
    const ssize_t n = read(from_child_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw EngineUnusable("engine: no answer to '" + op + "': " + how_it_ended("it closed its output"));
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

nlohmann::json EngineProcess::call(const nlohmann::json& request) {
  const std::string op = request.value("op", "?");
  if (pid_ <= 0) throw EngineUnusable("engine: not running (request '" + op + "')");
  write_all(request.dump() + "\n", op);
  ++requests_;
  return parse_response(read_line(op), op);
}

bool EngineProcess::quit() {
  if (pid_ <= 0) return false;
  try {
    write_all("{\"op\":\"quit\"}\n", "quit");
  } catch (const EngineUnusable&) {
  }
  close(to_child_);
  to_child_ = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      kill(-pid_, SIGKILL);
      pid_ = -1;
      return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill_and_reap();
  return false;
}

}  // namespace tinygpt::checks
