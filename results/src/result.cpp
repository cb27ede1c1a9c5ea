#include "tinygpt/results/result.h"

#include "tinygpt/atomic_file.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace tinygpt::results {

const char* to_string(Status s) {
  switch (s) {
    case Status::Pass: return "pass";
    case Status::Fail: return "fail";
    case Status::Error: return "error";
    case Status::Skipped: return "skipped";
  }
  return "?";
}

Status status_from_string(const std::string& s) {
  for (Status v : {Status::Pass, Status::Fail, Status::Error, Status::Skipped})
    if (s == to_string(v)) return v;
  throw std::invalid_argument("unknown check status '" + s + "' (pass, fail, error, skipped)");
}

std::string sci(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string s;
  for (const auto& x : items) s += (s.empty() ? "" : sep) + x;
  return s;
}

CheckResult error_result(const std::string& name, const std::string& message, double seconds) {
  CheckResult r;
  r.name = name;
  r.status = Status::Error;
  std::string msg = message;  // LibTorch appends a backtrace after the first line
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  r.detail = "error: " + msg;
  r.seconds = seconds;
  return r;
}

bool all_ok(const std::vector<CheckResult>& rows) {
  return std::all_of(rows.begin(), rows.end(), [](const CheckResult& r) { return r.ok(); });
}

Status worst(const std::vector<CheckResult>& rows) {
  auto rank = [](Status s) { return s == Status::Error ? 3 : s == Status::Fail ? 2 : s == Status::Pass ? 1 : 0; };
  if (rows.empty()) return Status::Pass;
  Status w = Status::Skipped;
  for (const auto& r : rows)
    if (rank(r.status) > rank(w)) w = r.status;
  return w;
}

namespace {

const char* verdict(Status s) {
  switch (s) {
    case Status::Pass: return "PASS";
    case Status::Fail: return "FAIL";
    case Status::Error: return "ERROR";
    case Status::Skipped: return "SKIP";
  }
  return "?";
}

struct Counts {
  int pass = 0, fail = 0, error = 0, skipped = 0;
};
Counts count(const std::vector<CheckResult>& rows) {
  Counts c;
  for (const auto& r : rows) {
    switch (r.status) {
      case Status::Pass: ++c.pass; break;
      case Status::Fail: ++c.fail; break;
      case Status::Error: ++c.error; break;
      case Status::Skipped: ++c.skipped; break;
    }
  }
  return c;
}

std::string verdict_line(const std::vector<CheckResult>& rows, const std::string& command) {
  const Counts c = count(rows);
  const std::string n = std::to_string(rows.size());
  if (c.fail || c.error) {
    std::string s = command + ": FAILED (" + std::to_string(c.fail) + " failed";
    if (c.error) s += ", " + std::to_string(c.error) + " errors";
    return s + " of " + n + " checks)";
  }
  std::string s = command + ": all " + n + " checks passed";
  if (c.skipped) s += " (" + std::to_string(c.skipped) + " skipped)";
  return s;
}

}  // namespace

std::string format_table(const std::vector<CheckResult>& rows, const std::string& command) {
  size_t w = 5;
  for (const auto& r : rows) w = std::max(w, r.name.size());
  std::ostringstream s;
  char line[2048];
  std::snprintf(line, sizeof line, "%-*s  %-7s  %8s  %s\n", static_cast<int>(w), "check", "verdict", "time", "key figure");
  s << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-*s  %-7s  %7.1fs  %s\n", static_cast<int>(w), r.name.c_str(), verdict(r.status),
                  r.seconds, r.detail.c_str());
    s << line;
  }
  s << verdict_line(rows, command) << "\n";
  return s.str();
}

nlohmann::json to_json(const CheckResult& r) {
  nlohmann::json j = {{"check", r.name},
                      {"status", to_string(r.status)},
                      {"passed", r.ok()},
                      {"figure", r.detail},
                      {"value", r.figure ? nlohmann::json(*r.figure) : nlohmann::json(nullptr)},
                      {"seconds", r.seconds}};
  if (!r.bound.empty()) j["bound"] = r.bound;
  if (!r.stats.empty()) {
    nlohmann::json st = nlohmann::json::object();
    for (const auto& [k, v] : r.stats) st[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
    j["stats"] = st;
  }
  if (!r.labels.empty()) j["labels"] = r.labels;
  return j;
}

nlohmann::json to_json(const std::vector<CheckResult>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rows) a.push_back(to_json(r));
  const Counts c = count(rows);
  return {{"passed", all_ok(rows)},
          {"counts", {{"pass", c.pass}, {"fail", c.fail}, {"error", c.error}, {"skipped", c.skipped}}},
          {"checks", a}};
}

size_t utf8_char(const std::string& s, size_t i, uint32_t& cp) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
  for (size_t k = 1; n && k < n; ++k) {
    if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) >> 6) != 2) return 0;
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  }
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

// XML 1.0 text: the five specials escaped, and every byte sequence that is not a character XML
// allows (invalid UTF-8, control characters but tab and newline, surrogates, U+FFFE and U+FFFF)
// written as U+FFFD, so the file parses whatever text a row carries.
std::string xml_escape(const std::string& s) {
  static const std::string replacement = "\xEF\xBF\xBD";
  std::string o;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '&': o += "&amp;"; break;
        case '<': o += "&lt;"; break;
        case '>': o += "&gt;"; break;
        case '"': o += "&quot;"; break;
        default: o += (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f ? replacement : std::string(1, static_cast<char>(c));
      }
      ++i;
      continue;
    }
    uint32_t cp = 0;
    size_t n = utf8_char(s, i, cp);
    if (n && (cp == 0xfffe || cp == 0xffff || (cp >= 0x80 && cp <= 0x9f))) n = 0;
    if (n == 0) {
      o += replacement;
      ++i;
    } else {
      o.append(s, i, n);
      i += n;
    }
  }
  return o;
}

std::string junit_xml(const std::vector<CheckResult>& rows, const std::string& suite) {
  const Counts c = count(rows);
  double total = 0;
  for (const auto& r : rows) total += r.seconds;
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<testsuite name=\"" << xml_escape(suite) << "\" tests=\"" << rows.size() << "\" failures=\"" << c.fail
    << "\" errors=\"" << c.error << "\" skipped=\"" << c.skipped << "\" time=\"" << total << "\">\n";
  for (const auto& r : rows) {
    x << "  <testcase classname=\"" << xml_escape(suite) << "\" name=\"" << xml_escape(r.name) << "\" time=\"" << r.seconds
      << "\">";
    switch (r.status) {
      case Status::Pass: x << "<system-out>" << xml_escape(r.detail) << "</system-out>"; break;
      case Status::Fail: x << "<failure message=\"" << xml_escape(r.detail) << "\"/>"; break;
      case Status::Error: x << "<error message=\"" << xml_escape(r.detail) << "\"/>"; break;
      case Status::Skipped: x << "<skipped message=\"" << xml_escape(r.detail) << "\"/>"; break;
    }
    x << "</testcase>\n";
  }
  x << "</testsuite>\n";
  return x.str();
}

std::string markdown_table(const std::vector<CheckResult>& rows) {
  auto cell = [](std::string s) {
    std::string o;
    for (char c : s) o += c == '|' ? std::string("\\|") : c == '\n' ? std::string(" ") : std::string(1, c);
    return o;
  };
  std::ostringstream m;
  m << "| check | verdict | time (s) | key figure |\n| --- | --- | ---: | --- |\n";
  char t[32];
  for (const auto& r : rows) {
    std::snprintf(t, sizeof t, "%.1f", r.seconds);
    const std::string v = r.ok() ? verdict(r.status) : std::string("**") + verdict(r.status) + "**";
    m << "| " << cell(r.name) << " | " << v << " | " << t << " | " << cell(r.detail) << " |\n";
  }
  return m.str();
}

void write_json_atomically(const std::string& path, const nlohmann::json& doc) {
  // Text from outside (an engine's error) may not be UTF-8: replaced, never a throw halfway through a report.
  write_text_atomically(path, doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace tinygpt::results
