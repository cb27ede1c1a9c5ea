#include "tinygpt/checks/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

#include "tinygpt/errors.h"

namespace tinygpt::checks {

namespace {

using nlohmann::json;

struct Figure {
  std::string label;
  bool higher_is_better = false;
  bool top1 = false;  // judged by the top-1 drop, not the margin
};

// The statistics a row may carry that say how far it is from its reference, with their direction.
const std::map<std::string, Figure>& known_stats() {
  static const std::map<std::string, Figure> m = {
      {"max_abs_diff", {"max |diff|"}}, {"kl_mean", {"KL mean"}}, {"kl_max", {"KL max"}}, {"kl_p99", {"KL p99"}},
      {"top1_agreement", {"top-1", true, true}}};
  return m;
}

struct Row {
  std::string status;
  std::map<std::string, double> figures;  // "value" and the known stats
};

std::string kind_of(const json& doc) {
  if (doc.contains("fault_matrix")) return "verify";
  if (doc.contains("command") && doc.contains("engine")) return "conform";
  return "equivalence";
}

void add_row(std::vector<std::pair<std::string, Row>>& out, const std::string& name, const json& c, const std::string& who) {
  if (!c.is_object() || !c.contains("status") || !c["status"].is_string())
    throw InputError(who + ": the row '" + name + "' has no \"status\"");
  Row r;
  r.status = c["status"].get<std::string>();
  if (c.contains("value") && c["value"].is_number()) r.figures["value"] = c["value"].get<double>();
  if (c.contains("stats") && c["stats"].is_object())
    for (const auto& [k, v] : c["stats"].items())
      if (known_stats().count(k) && v.is_number()) r.figures[k] = v.get<double>();
  for (const auto& [n, _] : out)
    if (n == name) throw InputError(who + ": the row '" + name + "' appears twice");
  out.emplace_back(name, std::move(r));
}

std::vector<std::pair<std::string, Row>> rows_of(const json& doc, const std::string& who) {
  if (!doc.is_object() || !doc.contains("checks") || !doc["checks"].is_array())
    throw InputError(who + ": not a tinygpt report (no \"checks\" array; `verify`, `conform` and `equivalence` write one with --json)");
  std::vector<std::pair<std::string, Row>> out;
  for (const auto& c : doc["checks"]) {
    const json* name = c.is_object() ? (c.contains("check") ? &c["check"] : c.contains("name") ? &c["name"] : nullptr) : nullptr;
    if (!name || !name->is_string()) throw InputError(who + ": a row of \"checks\" without a name");
    add_row(out, name->get<std::string>(), c, who);
  }
  if (doc.contains("fault_matrix") && doc["fault_matrix"].is_object()) {
    const json& m = doc["fault_matrix"];
    if (m.contains("controls") && m["controls"].is_array())
      for (const auto& ctl : m["controls"]) {
        if (!ctl.is_object() || !ctl.contains("checks") || !ctl["checks"].is_array()) continue;
        const std::string cache = ctl.value("cache", std::string("?"));
        for (const auto& c : ctl["checks"])
          if (c.is_object() && c.contains("name") && c["name"].is_string()) add_row(out, cache + ": " + c["name"].get<std::string>(), c, who);
      }
    if (m.contains("faults") && m["faults"].is_array())
      for (const auto& f : m["faults"])
        if (f.is_object() && f.contains("fault") && f["fault"].is_string() && f.contains("caught") && f["caught"].is_boolean())
          add_row(out, "fault: " + f["fault"].get<std::string>(), {{"status", f["caught"].get<bool>() ? "caught" : "missed"}}, who);
  }
  return out;
}

// 0 for a verdict that passes (pass, caught, skipped), 1 for one that does not.
int rank(const std::string& s) { return s == "pass" || s == "caught" || s == "skipped" ? 0 : 1; }

std::string sci(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", x);
  return b;
}

std::string label(const std::string& row, const std::string& key) {
  if (key != "value") return known_stats().at(key).label;
  return row == "fault-matrix" ? "faults caught" : "figure";
}

void judge(RowChange& ch, const Row* o, const Row* n, const CompareOptions& opt) {
  auto worse = [&](std::string why) {
    if (!ch.worse) ch.why = std::move(why);
    ch.worse = true;
  };
  if (o && !n) {
    if (!opt.allow_missing) worse("no longer in the report");
    return;
  }
  if (!o) return;  // a new row: shown, never judged
  if (o->status != "skipped" && n->status == "skipped" && !opt.allow_missing) worse("ran before, skipped now");
  if (rank(n->status) > rank(o->status)) worse(o->status + " -> " + n->status);
  if (rank(n->status) < rank(o->status)) ch.better = true;
  for (const auto& [key, was] : o->figures) {
    const auto it = n->figures.find(key);
    if (it == n->figures.end()) continue;
    const double now = it->second;
    if (std::isnan(was) || std::isnan(now) || std::abs(now - was) <= opt.floor) continue;
    const bool up = ch.row == "fault-matrix" && key == "value";  // the faults caught: more is better
    const Figure f = key == "value" ? Figure{"", up} : known_stats().at(key);
    std::string line = label(ch.row, key) + " " + sci(was) + " -> " + sci(now);
    if (!f.top1 && was > 0 && now > 0) {
      char r[32];
      std::snprintf(r, sizeof r, " (x%.3g)", now / was);
      line += r;
    }
    bool got_worse, got_better;
    if (f.top1) {
      got_worse = was - now > opt.top1_drop;
      got_better = now - was > opt.top1_drop;
    } else if (f.higher_is_better) {
      got_worse = now < was;
      got_better = now > was;
    } else {
      got_worse = now > was * (1 + opt.margin) + opt.floor;
      got_better = was > now * (1 + opt.margin) + opt.floor;
    }
    ch.moved.push_back(line);
    if (got_worse) worse(line);
    if (got_better) ch.better = true;
  }
  if (ch.worse) ch.better = false;
}

}  // namespace

int Comparison::worse() const {
  return static_cast<int>(std::count_if(rows.begin(), rows.end(), [](const RowChange& r) { return r.worse; }));
}
int Comparison::better() const {
  return static_cast<int>(std::count_if(rows.begin(), rows.end(), [](const RowChange& r) { return r.better; }));
}

Comparison compare_reports(const json& old_report, const json& new_report, const CompareOptions& o, const std::string& old_name,
                           const std::string& new_name) {
  if (!(o.margin >= 0) || !(o.floor >= 0) || !(o.top1_drop >= 0))
    throw std::invalid_argument("compare: the margin, the floor and the top-1 drop must be >= 0");
  const auto a = rows_of(old_report, old_name), b = rows_of(new_report, new_name);
  Comparison c;
  c.options = o;
  c.kind = kind_of(old_report);
  if (kind_of(new_report) != c.kind)
    throw InputError("compare: " + old_name + " is a " + c.kind + " report and " + new_name + " a " + kind_of(new_report) +
                     " report: compare two reports of the same command");
  auto engine = [](const json& d) { return d.contains("engine") && d["engine"].is_string() ? d["engine"].get<std::string>() : ""; };
  c.old_engine = engine(old_report), c.new_engine = engine(new_report);
  auto find = [](const std::vector<std::pair<std::string, Row>>& v, const std::string& n) -> const Row* {
    for (const auto& [k, r] : v)
      if (k == n) return &r;
    return nullptr;
  };
  for (const auto& [name, row] : a) {
    RowChange ch;
    ch.row = name;
    ch.old_status = row.status;
    const Row* n = find(b, name);
    if (n) ch.new_status = n->status;
    judge(ch, &row, n, o);
    c.rows.push_back(std::move(ch));
  }
  for (const auto& [name, row] : b)
    if (!find(a, name)) {
      RowChange ch;
      ch.row = name;
      ch.new_status = row.status;
      c.rows.push_back(std::move(ch));
    }
  return c;
}

std::string format_comparison(const Comparison& c, bool all_rows) {
  std::ostringstream s;
  if (!c.old_engine.empty() || !c.new_engine.empty())
    s << "engine: " << (c.old_engine.empty() ? "?" : c.old_engine) << " -> " << (c.new_engine.empty() ? "?" : c.new_engine) << "\n";
  size_t w = 3;
  for (const auto& r : c.rows) w = std::max(w, r.row.size());
  int shown = 0;
  for (const auto& r : c.rows) {
    const bool changed = r.old_status != r.new_status || !r.moved.empty();
    if (!all_rows && !changed && !r.worse) continue;
    ++shown;
    const std::string verdict = (r.old_status.empty() ? "-" : r.old_status) + " -> " + (r.new_status.empty() ? "-" : r.new_status);
    s << (r.worse ? "WORSE  " : r.better ? "better " : "       ") << r.row << std::string(w + 2 - r.row.size(), ' ') << verdict;
    for (const auto& m : r.moved) s << "; " << m;
    if (r.worse) s << "  [" << r.why << "]";
    s << "\n";
  }
  if (shown == 0) s << "no row changed verdict, and no figure moved by more than " << sci(c.options.floor) << "\n";
  char m[64];
  std::snprintf(m, sizeof m, "x%.3g", 1 + c.options.margin);
  s << "compare: " << c.kind << " reports, " << c.rows.size() << " rows: " << c.worse() << " worse, " << c.better() << " better (a figure is worse past "
    << m << " its old value + " << sci(c.options.floor) << ", top-1 past a drop of " << c.options.top1_drop << ")"
    << (c.passed() ? "; no row got worse\n" : "; FAIL\n");
  return s.str();
}

nlohmann::json to_json(const Comparison& c) {
  json rows = json::array();
  for (const auto& r : c.rows)
    rows.push_back({{"row", r.row}, {"old", r.old_status}, {"new", r.new_status}, {"moved", r.moved}, {"worse", r.worse},
                    {"better", r.better}, {"why", r.why}});
  json engines = nullptr;
  if (!c.old_engine.empty() || !c.new_engine.empty()) engines = {{"old", c.old_engine}, {"new", c.new_engine}};
  return {{"kind", c.kind},
          {"engines", engines},
          {"passed", c.passed()},
          {"worse", c.worse()},
          {"better", c.better()},
          {"options", {{"margin", c.options.margin}, {"floor", c.options.floor}, {"top1_drop", c.options.top1_drop},
                       {"allow_missing", c.options.allow_missing}}},
          {"rows", rows}};
}

}  // namespace tinygpt::checks
