#include "tinygpt/checks/diagnose.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <type_traits>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tinygpt/atomic_file.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/parallel_runs.h"
#include "tinygpt/checks/target.h"

namespace tinygpt::checks {

namespace {

// What to do, for the faults a real engine is most likely to show on purpose or by a known bug.
const std::map<std::string, std::string>& remedies() {
  static const std::map<std::string, std::string> m = {
      {"never-trimmed",
       "the engine attends to more than context + 1 keys past the window, as if its cache never trims: if it keeps "
       "every token on purpose (no sliding window), declare \"no-window\" in hello (or run with --no-past-window); if not, "
       "trim after attending (SPEC 4)"},
      {"trim-before-attend", "past the window a decode query sees context keys, one too few: trim after attending (SPEC 4)"},
      {"rope-offset", "decode steps are rotated as if at position 0: pass the row's position to RoPE"},
      {"loop-clamped-positions", "positions stop growing at the window's last slot: keep counting past the context (SPEC 4)"},
      {"loop-wrapped-positions", "positions wrap at the window: keep counting past the context (SPEC 4)"},
      {"topleft-mask", "the single decode query is masked top-left: align the causal mask bottom-right"},
      {"no-reset", "the next sequence starts on the previous one's entries: clear the cache on reset"},
      {"loop-positions-stop-at-context",
       "the positions stop growing at the context: count them from the tokens fed, not from the trimmed cache's length or "
       "attention mask"},
  };
  return m;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool is_model_check(const std::string& name) {
  const auto& t = model_checks();
  return std::any_of(t.begin(), t.end(), [&](const CheckDef& c) { return c.name == name; });
}

struct Seen {
  std::set<std::string> failing;
  std::map<std::string, int64_t> first;  // row -> first position over its bound
  std::map<std::string, double> size;    // row -> the |diff| there
  std::map<std::string, int64_t> own;    // row -> that position in the engine's frame, where it differs (long-prompt)
  std::map<std::string, double> worst;   // row -> its largest |diff| (how the error grew after the first)
  std::map<std::string, double> kl;      // row -> its mean KL
  std::map<std::string, int64_t> worst_at;  // row -> where its |diff| peaks
};

Seen seen_in(const std::vector<CheckResult>& rows) {
  Seen s;
  for (const auto& r : rows) {
    if (!r.failed() || !is_model_check(r.name)) continue;
    s.failing.insert(r.name);
    auto take = [&](const char* key, auto& into) {  // the row's statistic, where it has one
      const auto it = r.stats.find(key);
      if (it != r.stats.end()) into[r.name] = static_cast<typename std::decay_t<decltype(into)>::mapped_type>(it->second);
    };
    take("first_over", s.first);
    take("first_over_engine", s.own);
    take("first_over_diff", s.size);
    take("max_abs_diff", s.worst);
    take("worst_at", s.worst_at);
    take("kl_mean", s.kl);
  }
  return s;
}

// A catalogue fault's run of `rows` on our model: what the diagnosis compares the engine with. It is
// our model's own computation, so it is kept beside the references (TINYGPT_REFERENCE_CACHE, keyed by
// the build, the weights, every option, the fault and the rows): the runs that ask the same question
// share one answer. Only what a diagnosis reads is kept: each row's name, verdict and statistics.
std::vector<CheckResult> fault_run(GPT& model, const EquivalenceOptions& opts, const CacheVariant& f,
                                   const std::vector<std::string>& rows, const Reference& ref) {
  const std::string path = cache_entry_path(model, "diagnosis", options_key(opts) + " | " + f.name + " | " + join(rows), ".json");
  std::error_code ec;
  if (!path.empty() && std::filesystem::exists(path, ec)) {
    try {
      std::vector<CheckResult> out;
      const nlohmann::json doc = nlohmann::json::parse(std::ifstream(path));  // kept alive: the loop reads into it
      for (const auto& j : doc.at("rows")) {
        CheckResult r;
        r.name = j.at("name").get<std::string>();
        r.status = j.at("failed").get<bool>() ? Status::Fail : Status::Pass;
        r.stats = j.at("stats").get<std::map<std::string, double>>();
        out.push_back(std::move(r));
      }
      return out;
    } catch (const std::exception&) {  // unreadable: run again
    }
  }
  ModelTarget t(model, f);
  std::vector<CheckResult> out = run_checks(model, opts, t, rows, &ref).checks;
  if (!path.empty()) {
    nlohmann::json doc = {{"fault", f.name}, {"rows", nlohmann::json::array()}};
    for (const auto& r : out) doc["rows"].push_back({{"name", r.name}, {"failed", r.failed()}, {"stats", r.stats}});
    try {
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      write_text_atomically(path, doc.dump());
    } catch (const std::exception&) {  // a cache that cannot be written only costs the next run time
    }
  }
  return out;
}

std::string positions(const Seen& s, const std::vector<std::string>& order) {
  std::string out;
  for (const auto& n : order)
    if (s.first.count(n))
      out += (out.empty() ? "" : ", ") + n + " " + std::to_string(s.first.at(n)) +
             (s.own.count(n) ? " (the engine's " + std::to_string(s.own.at(n)) + ")" : "");
  return out;
}

}  // namespace

Diagnosis diagnose(GPT& model, const EquivalenceOptions& opts, const std::vector<CheckResult>& rows,
                   const std::function<void(const std::string&)>& progress) {
  Diagnosis d;
  const Seen engine = seen_in(rows);
  std::vector<std::string> order;  // table order
  for (const auto& c : model_checks())
    if (engine.failing.count(c.name)) order.push_back(c.name);
  d.failing = order;
  if (order.empty()) return d;
  std::set<std::string> ran;  // rows the run judged (not skipped)
  for (const auto& r : rows)
    if (is_model_check(r.name) && r.status != Status::Skipped) ran.insert(r.name);

  // Candidates: faults that must be caught by one of the failing rows; each runs the failing rows and
  // the rows that must catch it which the run judged (a match must pass the ones the engine passed).
  std::vector<const CacheVariant*> faults;
  std::vector<std::vector<std::string>> runs;
  for (const CacheVariant* f : cache_registry().all(/*faults=*/true)) {
    if (std::none_of(f->expected.begin(), f->expected.end(), [&](const std::string& n) { return engine.failing.count(n) > 0; }))
      continue;
    std::vector<std::string> run;
    for (const auto& c : model_checks())
      if (engine.failing.count(c.name) || (ran.count(c.name) && std::count(f->expected.begin(), f->expected.end(), c.name)))
        run.push_back(c.name);
    faults.push_back(f);
    runs.push_back(run);
  }
  if (progress) progress("diagnosis: " + std::to_string(faults.size()) + " faults of the catalogue fail one of " + join(order) + "; running them on our model");
  at::NoGradGuard no_grad;
  const Reference ref = build_reference(model, opts);
  std::vector<Seen> got(faults.size());
  run_in_parallel(faults.size(), default_workers(opts.prompt.device()), [&](size_t i) {
    try {
      got[i] = seen_in(fault_run(model, opts, *faults[i], runs[i], ref));
    } catch (const std::exception&) {
      got[i] = Seen{};  // a fault that cannot run these rows matches nothing
    }
  });
  int best = -1000;
  size_t closest = faults.size();
  std::vector<std::pair<double, std::string>> same_rows;  // how far the |diff| there is (log ratio), fault
  std::vector<std::string> unplaced;  // the same rows fail, but no row names a position to match by
  for (size_t i = 0; i < faults.size(); ++i) {
    const Seen& g = got[i];
    bool same = g.failing == engine.failing;
    // How far the fault's figures are from the engine's, as a log ratio: the |diff| where the row
    // first parts, and how the error grows after it - the row's worst |diff| and its mean KL (which
    // goes as a |diff| squared, so half its log ratio). Two faults that break the same step alike can
    // grow apart: a cache one entry short stays near its first error, one never trimmed keeps growing.
    double far = 0;
    auto apart = [&](const std::map<std::string, double>& a, const std::map<std::string, double>& b, const std::string& n,
                     double weight) {
      if (a.count(n) && b.count(n) && a.at(n) > 0 && b.at(n) > 0) far = std::max(far, weight * std::abs(std::log(a.at(n) / b.at(n))));
    };
    int placed = 0;  // failing rows where both name the position they part at: the evidence of a match
    for (const auto& [n, p] : engine.first) {
      if (g.first.count(n) && g.first.at(n) != p) same = false;
      if (g.first.count(n)) ++placed;
      apart(g.size, engine.size, n, 1.0);
      apart(g.worst, engine.worst, n, 1.0);
      apart(g.kl, engine.kl, n, 0.5);
      // Where the error peaks, when it grew well past its first |diff| on both (a peak, not noise):
      // a cache that keeps the prompt's first tokens peaks soon after the window, one never trimmed
      // keeps growing to the end, at like sizes.
      auto grew = [&](const Seen& x) {
        return x.worst.count(n) && x.size.count(n) && x.worst_at.count(n) && x.worst.at(n) > 2 * x.size.at(n);
      };
      if (grew(g) && grew(engine)) {
        const int64_t e_at = engine.worst_at.at(n), slack = std::max<int64_t>(4, (e_at - p) / 3);
        if (std::abs(g.worst_at.at(n) - e_at) > slack) far = std::max(far, 1e9);
      }
    }
    if (same && placed == 0) unplaced.push_back(faults[i]->name);
    else if (same) same_rows.emplace_back(far, faults[i]->name);
    int overlap = 0;  // rows both fail, less the rows only one of them fails
    for (const auto& n : g.failing) overlap += engine.failing.count(n) ? 1 : -1;
    for (const auto& n : engine.failing) overlap -= g.failing.count(n) ? 0 : 1;
    if (overlap > best && !g.failing.empty()) best = overlap, closest = i;
  }
  // The same rows, first at the same positions: the nearest |diff| there first (two bugs that both
  // break the first decode step differ in how much).
  // A match differs from the engine by less than kFactor in that |diff|; the others only resemble it.
  constexpr double kFactor = 3.0;
  std::sort(same_rows.begin(), same_rows.end());
  std::vector<std::string> resembling;
  for (const auto& [far, name] : same_rows) (far <= std::log(kFactor) ? d.matches : resembling).push_back(name);
  const std::string where = positions(engine, order);
  d.text = "the failing rows (" + join(order) + (where.empty() ? "" : "; first over the bound at: " + where) + ") ";
  if (!d.matches.empty()) {
    const std::string& m = d.matches.front();
    const auto it = remedies().find(m);
    d.text += "match the fault " + m + " on our model: the same rows fail, first at the same positions, by a like |diff| there and at their worst; " +
              (it != remedies().end() ? it->second : cache_registry().get(m).description);
    if (d.matches.size() > 1) {
      d.text += " (also failing these rows at these positions, by a |diff| further from the engine's: " +
                join(std::vector<std::string>(d.matches.begin() + 1, d.matches.end())) + ")";
    }
  } else if (!resembling.empty()) {
    d.closest = resembling.front();
    d.text += "match no known fault: " + join(resembling) + " fail" + (resembling.size() > 1 ? "" : "s") +
              " these rows first at these positions on our model, but the error grows otherwise (a |diff| there or at the row's "
              "worst more than " + std::to_string(int(kFactor)) + " times from the engine's, or the worst at another "
              "position): another bug breaking the same step";
  } else if (!unplaced.empty()) {
    d.closest = unplaced.front();
    d.text += "match no known fault for certain: " + join(unplaced) + " fail" + (unplaced.size() > 1 ? "" : "s") +
              " the same rows on our model, but neither side names a position where they part, so nothing tells them "
              "apart (another bug of the same operation, or that one)";
  } else {
    d.text += "match no known fault";
    if (closest < faults.size()) {
      d.closest = faults[closest]->name;
      std::vector<std::string> fails;
      for (const auto& c : model_checks())
        if (got[closest].failing.count(c.name)) fails.push_back(c.name);
      const std::string at = positions(got[closest], fails);
      d.text += " (the closest, " + d.closest + " - " + faults[closest]->description + " - fails " + join(fails) +
                (at.empty() ? "" : ", first at: " + at) + ")";
    }
  }
  return d;
}

}  // namespace tinygpt::checks
