#include "engine_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "tinygpt/results/result.h"

namespace tinygpt::checks {

namespace {

// The process groups of the engines running now, for the signal handler: a fixed table of atomics,
// since a handler may only touch lock-free state. A slot holds a group id, or 0.
constexpr int kMaxEngines = 64;
std::atomic<pid_t> g_groups[kMaxEngines];
struct sigaction g_previous[3];
constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};

// SIGINT (Ctrl-C reaches only the terminal's foreground group, and each engine has its own), SIGTERM
// (a CI job's timeout) and SIGHUP: end every engine's whole group, then let the signal do what it
// did before (by default, end this process with it).
extern "C" void end_engines_and_reraise(int sig) {
  for (auto& g : g_groups) {
    const pid_t pg = g.load();
    if (pg > 0) kill(-pg, SIGKILL);
  }
  for (int i = 0; i < 3; ++i)
    if (kSignals[i] == sig) sigaction(sig, &g_previous[i], nullptr);
  raise(sig);
}

void install_handlers_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < 3; ++i) {
      sigaction(kSignals[i], nullptr, &g_previous[i]);
      if (g_previous[i].sa_handler == SIG_IGN) continue;  // a signal the program ignores stays ignored
      struct sigaction a {};
      a.sa_handler = end_engines_and_reraise;
      sigemptyset(&a.sa_mask);
      a.sa_flags = SA_RESTART;
      sigaction(kSignals[i], &a, nullptr);
    }
  });
}

void track_group(pid_t pg) {
  for (auto& g : g_groups) {
    pid_t empty = 0;
    if (g.compare_exchange_strong(empty, pg)) return;
  }
}
void untrack_group(pid_t pg) {
  for (auto& g : g_groups) {
    pid_t mine = pg;
    if (g.compare_exchange_strong(mine, 0)) return;
  }
}

// A line longer than this is no answer of the protocol (the largest, a batch of logits of a large
// vocabulary, is a few MB): reading stops there, so a flood cannot take the memory or the verdict.
constexpr size_t kMaxLineBytes = size_t{64} << 20;

}  // namespace

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
    uint32_t cp = 0;
    size_t n = results::utf8_char(s, i, cp);
    if (cp == 0xfffe || cp == 0xffff) n = 0;  // the non-characters are not text
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

std::string engine_json(const nlohmann::json& j, size_t max_bytes) {
  return engine_text(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max_bytes);
}

namespace {
std::string clip(const std::string& s) { return engine_text(s, 200); }

// A recursive-descent reader of RFC 8259 JSON into nlohmann::json; throws Refused where nlohmann
// would refuse the text.
class FastJson {
 public:
  struct Refused {};
  explicit FastJson(const std::string& s) : p_(s.data()), end_(s.data() + s.size()) {}

  nlohmann::json document() {
    if (end_ - p_ >= 3 && std::memcmp(p_, "\xEF\xBB\xBF", 3) == 0) p_ += 3;  // a byte order mark, skipped as nlohmann does
    nlohmann::json v = value();
    space();
    if (p_ != end_) throw Refused{};
    return v;
  }

 private:
  void space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  void literal(const char* word) {
    for (; *word; ++word, ++p_)
      if (p_ == end_ || *p_ != *word) throw Refused{};
  }

  nlohmann::json value() {
    space();
    if (p_ == end_) throw Refused{};
    switch (*p_) {
      case '{': return object();
      case '[': return array();
      case '"': return string();
      case 't': return literal("true"), nlohmann::json(true);
      case 'f': return literal("false"), nlohmann::json(false);
      case 'n': return literal("null"), nlohmann::json(nullptr);
      default: return number();
    }
  }

  // The members of an object or the items of an array after its opening bracket, each read by
  // `item`, comma-separated, up to `close`.
  template <class Item>
  void members(char close, Item item) {
    ++p_;
    space();
    if (p_ != end_ && *p_ == close) return void(++p_);
    for (;;) {
      item();
      space();
      if (p_ == end_) throw Refused{};
      if (*p_ == close) return void(++p_);
      if (*p_ != ',') throw Refused{};
      ++p_;
    }
  }

  nlohmann::json object() {
    nlohmann::json o = nlohmann::json::object();
    members('}', [&] {
      space();
      if (p_ == end_ || *p_ != '"') throw Refused{};
      const std::string key = string().get<std::string>();
      space();
      if (p_ == end_ || *p_ != ':') throw Refused{};
      ++p_;
      o[key] = value();  // a repeated key: the last one stands, as nlohmann's parser keeps it
    });
    return o;
  }

  nlohmann::json array() {
    nlohmann::json a = nlohmann::json::array();
    auto& items = a.get_ref<nlohmann::json::array_t&>();
    members(']', [&] { items.push_back(value()); });
    return a;
  }

  // The token's extent here (an unescaped quote ends it); nlohmann decodes and checks it.
  nlohmann::json string() {
    const char* start = p_++;
    bool plain = true;
    for (;; ++p_) {
      if (p_ == end_) throw Refused{};
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') break;
      if (c == '\\') {
        plain = false;
        if (++p_ == end_) throw Refused{};
      } else if (c < 0x20 || c >= 0x80) {
        plain = false;
      }
    }
    ++p_;
    if (plain) return nlohmann::json(std::string(start + 1, p_ - 1));
    nlohmann::json s = nlohmann::json::parse(start, p_, nullptr, /*allow_exceptions=*/false);
    if (s.is_discarded()) throw Refused{};
    return s;
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?: an integer as nlohmann stores it (unsigned when
  // not negative, signed when negative, a double past 64 bits), any other number a double.
  nlohmann::json number() {
    const char* start = p_;
    auto digits = [&] {
      const char* d = p_;
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      return p_ - d;
    };
    const bool negative = p_ != end_ && *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') throw Refused{};
    if (*p_ == '0') ++p_;
    else digits();
    bool integral = true;
    if (p_ != end_ && *p_ == '.') {
      ++p_, integral = false;
      if (digits() == 0) throw Refused{};
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_, integral = false;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (digits() == 0) throw Refused{};
    }
    if (integral) {
      if (negative) {
        int64_t i = 0;
        if (const auto r = std::from_chars(start, p_, i); r.ec == std::errc() && r.ptr == p_) return nlohmann::json(i);
      } else {
        uint64_t u = 0;
        if (const auto r = std::from_chars(start, p_, u); r.ec == std::errc() && r.ptr == p_) return nlohmann::json(u);
      }
    }
    double d = 0;
    if (const auto r = std::from_chars(start, p_, d); r.ec == std::errc() && r.ptr == p_) return nlohmann::json(d);
    // Out of a double's range: strtod's 0 or subnormal stands; its infinity is refused (nlohmann's
    // "number overflow").
    const double far = std::strtod(std::string(start, p_).c_str(), nullptr);
    if (!std::isfinite(far)) throw Refused{};
    return nlohmann::json(far);
  }

  const char* p_;
  const char* end_;
};

}  // namespace

nlohmann::json parse_json_fast(const std::string& text) {
  try {
    return FastJson(text).document();
  } catch (const FastJson::Refused&) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

nlohmann::json parse_response(const std::string& line, const std::string& op) {
  nlohmann::json j = parse_json_fast(line);
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
  // Writes never block: an engine that stops reading cannot hold the suite past --timeout.
  fcntl(to_child_, F_SETFL, fcntl(to_child_, F_GETFL) | O_NONBLOCK);
  signal(SIGPIPE, SIG_IGN);  // a dead engine is an error we report, not a signal that kills us
  install_handlers_once();
  track_group(pid_);
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
  if (pid_ > 0) {
    int status = 0;
    bool exited = false;
    for (int i = 0; i < 20 && !exited; ++i) {  // closed stdin: a well-behaved engine exits; give it 200 ms
      exited = waitpid(pid_, &status, WNOHANG) == pid_;
      if (!exited) drain_output(std::chrono::milliseconds(10));  // an engine blocked writing can exit
    }
    kill(-pid_, SIGKILL);  // the group: anything the shell started, whatever the shell did
    if (!exited) waitpid(pid_, &status, 0);
    untrack_group(pid_);
    pid_ = -1;
  }
  if (from_child_ >= 0) close(from_child_), from_child_ = -1;
}

void EngineProcess::drain_output(std::chrono::milliseconds wait) {
  if (from_child_ < 0) return;
  pollfd p{from_child_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(wait.count())) <= 0) return;
  char chunk[65536];
  for (int i = 0; i < 64; ++i) {  // what is there now, up to 4 MB a call; discarded
    const ssize_t n = read(from_child_, chunk, sizeof chunk);
    if (n <= 0) return;
    if (poll(&p, 1, 0) <= 0) return;
  }
}

void EngineProcess::write_all(const std::string& s, const std::string& op) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s_);
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(to_child_, s.data() + done, s.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      throw EngineUnusable("engine: no answer to '" + op + "': " + how_it_ended("it closed its input"));
    // The pipe is full: wait until the engine reads, reading what it writes meanwhile (an engine
    // that answers early would otherwise block on its own full output).
    const double left = std::chrono::duration<double>(deadline - clock::now()).count();
    if (left <= 0)
      throw EngineUnusable("engine: it stopped reading the request '" + op + "' (" + std::to_string(done) + " of " +
                           std::to_string(s.size()) + " bytes written within " + std::to_string(int(timeout_s_)) +
                           " s, --timeout)");
    pollfd p[2] = {{to_child_, POLLOUT, 0}, {from_child_, POLLIN, 0}};
    const int r = poll(p, 2, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (r < 0 && errno != EINTR) throw EngineUnusable(std::string("engine: poll failed: ") + std::strerror(errno));
    if (r > 0 && (p[1].revents & POLLIN)) read_some(op);
    if (r > 0 && (p[0].revents & (POLLERR | POLLHUP)))
      throw EngineUnusable("engine: no answer to '" + op + "': " + how_it_ended("it closed its input"));
  }
  sent_ += static_cast<double>(s.size());
}

bool EngineProcess::read_some(const std::string& op) {
  char chunk[65536];
  const ssize_t n = read(from_child_, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) return false;
  buffer_.append(chunk, static_cast<size_t>(n));
  const void* last_nl = memrchr(chunk, '\n', static_cast<size_t>(n));
  partial_ = last_nl ? static_cast<size_t>(chunk + n - static_cast<const char*>(last_nl) - 1) : partial_ + static_cast<size_t>(n);
  if (partial_ > kMaxLineBytes)
    throw EngineUnusable("engine: the answer to '" + op + "' is a line of more than " + std::to_string(kMaxLineBytes >> 20) +
                         " MB, longer than any answer of the protocol: " + clip(buffer_.substr(0, 200)));
  return true;
}

std::string EngineProcess::read_line(const std::string& op) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s_);
  for (;;) {
    // Only the bytes not yet searched are searched: a long line costs its length, once.
    if (auto nl = buffer_.find('\n', scanned_); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      scanned_ = 0;
      return line;
    }
    scanned_ = buffer_.size();
    const double left = std::chrono::duration<double>(deadline - clock::now()).count();
    if (left <= 0)
      throw EngineUnusable("engine: no answer to '" + op + "' within " + std::to_string(int(timeout_s_)) + " s (--timeout)");
    pollfd p{from_child_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (r < 0 && errno != EINTR) throw EngineUnusable(std::string("engine: poll failed: ") + std::strerror(errno));
    if (r <= 0) continue;
    if (!read_some(op)) throw EngineUnusable("engine: no answer to '" + op + "': " + how_it_ended("it closed its output"));
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
      untrack_group(pid_);
      pid_ = -1;
      return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    drain_output(std::chrono::milliseconds(10));  // keep reading: an engine blocked writing could never exit
  }
  kill_and_reap();
  return false;
}

}  // namespace tinygpt::checks
