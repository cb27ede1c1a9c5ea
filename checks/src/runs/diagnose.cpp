#include "tinygpt/checks/diagnose.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>


#include <nlohmann/json.hpp>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_names.h"
#include "tinygpt/checks/faults.h"
#include "tinygpt/checks/parallel_runs.h"
#include "tinygpt/checks/target.h"

namespace tinygpt::checks {

namespace {

bool is_model_check(const std::string& name) {
  const auto& t = model_checks();
  return std::any_of(t.begin(), t.end(), [&](const CheckDef& c) { return c.name == name; });
}

// How each serving row's operation reads in a diagnosis: the operation a failure of the row followed,
// and the entries it touched. The churn row says its own (ChurnSignature, its labels).
struct RowOp {
  const char* op;
  const char* entries;
};
const std::map<std::string, RowOp>& row_ops() {
  static const std::map<std::string, RowOp> m = {
      {check::kRagged, {"a ragged prefill", "of rows of other lengths beside it"}},
      {check::kJoinLeave, {"release + admit", "of a joined row, in a released row's slot"}},
      {check::kFork, {"fork", "copied from the parent"}},
      {check::kRollback, {"truncate", "a rollback kept or brought back"}},
      {check::kBatchSizes, {"a batch of another size", "of the batch's rows"}},
      {check::kChunkedPrefill, {"extend", "of the new chunk"}},
      {check::kThreadCounts, {"threads", "computed on other threads"}},
      {check::kPrefixReuse, {"admit with a reused prefix", "reused from another row"}},
      {check::kSharedPrefix, {"a shared prefix", "shared between rows"}},
      {check::kSaveRestore, {"save + restore", "restored"}},
      {check::kRollbackAfterRestore, {"truncate after a restore", "restored, then rolled back"}},
      {check::kContextShift, {"shift", "shifted"}},
      {check::kReuseAfterShift, {"admit with a prefix reused after a shift", "reused from a shifted row"}},
      {check::kReusePastWindow, {"admit with a prefix reused past the window", "reused from a row past the window"}},
      {check::kServed, {"generate (the engine's own schedule)", "of the engine's own schedule"}},
  };
  return m;
}

// What one row showed where it first parted: the signature a diagnosis matches by.
struct RowSeen {
  std::optional<int64_t> first;   // the first position over its bound (the request's frame)
  std::optional<int64_t> own;     // that position in the engine's frame, where it differs (long-prompt, a shifted churn row)
  std::optional<double> size;     // the |diff| there
  std::optional<double> worst;    // its largest |diff| (how the error grew after the first)
  std::optional<double> kl;       // its mean KL
  std::optional<int64_t> worst_at;  // where its |diff| peaks
  std::string op;                 // churn: the operation the first divergence followed ("fork", ...); "" elsewhere
  std::string followed;           // churn: that operation in words, with its script line
};

struct Seen {
  std::set<std::string> failing;
  std::map<std::string, RowSeen> rows;  // per failing row
};

Seen seen_in(const std::vector<CheckResult>& rows) {
  Seen s;
  for (const auto& r : rows) {
    if (!r.failed() || !is_model_check(r.name)) continue;
    s.failing.insert(r.name);
    RowSeen& x = s.rows[r.name];
    auto stat = [&](const char* key) -> std::optional<double> {
      const auto it = r.stats.find(key);
      return it == r.stats.end() ? std::nullopt : std::optional<double>(it->second);
    };
    auto pos = [&](const char* key) -> std::optional<int64_t> {
      const auto v = stat(key);
      return v ? std::optional<int64_t>(static_cast<int64_t>(*v)) : std::nullopt;
    };
    x.first = pos("first_over");
    x.own = pos("first_over_engine");
    x.size = stat("first_over_diff");
    x.worst = stat("max_abs_diff");
    x.kl = stat("kl_mean");
    x.worst_at = pos("worst_at");
    auto label = [&](const char* key) {
      const auto it = r.labels.find(key);
      return it == r.labels.end() ? std::string() : it->second;
    };
    x.op = label("op");
    x.followed = label("followed");
  }
  return s;
}

// Whether two comma-joined lists of operation kinds ("extend,fork") name one in common.
bool shares_one(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    std::set<std::string> out;
    size_t i = 0;
    while (i <= s.size()) {
      const size_t j = std::min(s.find(',', i), s.size());
      if (j > i) out.insert(s.substr(i, j - i));
      i = j + 1;
    }
    return out;
  };
  const auto x = split(a), y = split(b);
  return std::any_of(x.begin(), x.end(), [&](const std::string& k) { return y.count(k) > 0; });
}

// What the engine showed in one failing row, in words: the operation it followed, the entries, where.
std::string saw_in(const std::string& name, const RowSeen& x, int64_t context) {
  std::string out = name + ": ";
  if (!x.op.empty()) {
    out += "after " + x.followed;
  } else if (const auto it = row_ops().find(name); it != row_ops().end()) {
    out += "after " + std::string(it->second.op) + " (entries " + it->second.entries + ")";
  } else {
    out += "a plain step (no serving operation)";
  }
  if (!x.first) {
    out += ", the row names no position";
  } else {
    out += ", first at position " + std::to_string(*x.first) + (x.own ? " (the engine's " + std::to_string(*x.own) + ")" : "") +
           (*x.first >= context ? ", past the window" : ", inside the window");
  }
  return out;
}

// A catalogue fault's run of `rows` on our model: what the diagnosis compares the engine with. It is
// our model's own computation, so it is kept beside the references (TINYGPT_REFERENCE_CACHE, keyed by
// the build, the weights, every option, the fault and the rows): the runs that ask the same question
// share one answer. Only what a diagnosis reads is kept: each row's name, verdict and statistics.
std::vector<CheckResult> fault_run(GPT& model, const EquivalenceOptions& opts, const CacheVariant& f,
                                   const std::vector<std::string>& rows, const Reference& ref) {
  std::vector<CheckResult> out;
  kept_json(
      model, "diagnosis", options_key(opts) + " | " + f.name + " | " + join(rows),
      [&] {
        ModelTarget t(model, f);
        nlohmann::json doc = {{"fault", f.name}, {"rows", nlohmann::json::array()}};
        for (const auto& r : run_checks(model, opts, t, rows, &ref).checks)
          doc["rows"].push_back({{"name", r.name}, {"failed", r.failed()}, {"stats", r.stats}, {"labels", r.labels}});
        return doc;
      },
      [&](const nlohmann::json& doc) {
        out.clear();
        for (const auto& j : doc.at("rows")) {
          CheckResult r;
          r.name = j.at("name").get<std::string>();
          r.status = j.at("failed").get<bool>() ? Status::Fail : Status::Pass;
          r.stats = j.at("stats").get<std::map<std::string, double>>();
          if (j.contains("labels")) r.labels = j.at("labels").get<std::map<std::string, std::string>>();
          out.push_back(std::move(r));
        }
      });
  return out;
}

std::string positions(const Seen& s, const std::vector<std::string>& order) {
  std::string out;
  for (const auto& n : order) {
    const auto it = s.rows.find(n);
    if (it == s.rows.end() || !it->second.first) continue;
    const RowSeen& x = it->second;
    out += (out.empty() ? "" : ", ") + n + " " + std::to_string(*x.first) + (x.own ? " (the engine's " + std::to_string(*x.own) + ")" : "");
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const Diagnosis& d) {
  return {{"failing", d.failing}, {"matches", d.matches}, {"closest", d.closest}, {"saw", d.saw}, {"differs", d.differs}, {"text", d.text}};
}

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
  // Churn drives every operation, so it catches every serving fault whose matrix runs it, whichever row
  // the fault is named for: with churn failing, those are candidates too.
  const bool churn_failed = engine.failing.count(check::kChurn) > 0;
  // The catalogue's faults, and the zoo's boundary faults where the model has their feature.
  const std::vector<const CacheVariant*> catalogue = faults_for(model->config(), FaultUse::Diagnosis).faults;
  for (const CacheVariant* f : catalogue) {
    const bool churned = churn_failed && std::count(f->checks.begin(), f->checks.end(), std::string(check::kChurn)) > 0;
    if (!churned &&
        std::none_of(f->expected.begin(), f->expected.end(), [&](const std::string& n) { return engine.failing.count(n) > 0; }))
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
  const int64_t context = model->config().context;
  // A row with the check's own schedule matches within this factor of the engine's |diff| and worst.
  constexpr double kFactor = 3.0;
  int best = -1000;
  size_t closest = faults.size();
  // Faults whose signature holds on every row both fail (diagnose.h), ranked: the engine's own rows
  // first, then the most rows in common and the fewest apart, then positions, then magnitudes.
  struct Candidate {
    std::string name;
    std::vector<std::string> shared;  // the rows both fail, in table order
    size_t apart = 0;                 // the rows only one of them fails
    std::string rows_differ;          // those rows, in words ("" when none)
    bool exact = false;               // every position equal too (where the check fixes the schedule)
    bool same_positions = false;      // every row both fail first at the same position
    double far = 0;                   // how far the magnitudes are (log ratio), the tie-break
    std::string differs;              // for one that resembles: where its signature differs, in words
    bool same_rows() const { return apart == 0; }  // fails exactly the engine's rows
    bool operator<(const Candidate& o) const {
      if (same_rows() != o.same_rows()) return same_rows();
      if (shared.size() != o.shared.size()) return shared.size() > o.shared.size();
      if (apart != o.apart) return apart < o.apart;
      return exact != o.exact ? exact : far != o.far ? far < o.far : name < o.name;
    }
  };
  // Rows where the engine chooses what it reuses or how it schedules: the first wrong position follows
  // its choice (how long a prefix it took, where it placed a request), so it only ranks.
  const std::set<std::string> engine_placed = {check::kPrefixReuse, check::kReuseAfterShift, check::kReusePastWindow, check::kServed};
  std::vector<Candidate> same_signature;  // the signature holds: a match
  std::vector<Candidate> resembling;      // the same rows, but the signature differs
  std::vector<std::string> unplaced;      // the same rows, and no row says where it parted
  for (size_t i = 0; i < faults.size(); ++i) {
    const Seen& g = got[i];
    std::vector<std::string> shared, only_fault, only_engine;
    for (const auto& c : model_checks()) {
      const bool f = g.failing.count(c.name) > 0, e = engine.failing.count(c.name) > 0;
      if (f && e) shared.push_back(c.name);
      else if (f) only_fault.push_back(c.name);
      else if (e) only_engine.push_back(c.name);
    }
    const size_t apart = only_fault.size() + only_engine.size();
    const int overlap = static_cast<int>(shared.size()) - static_cast<int>(apart);  // rows both fail, less those only one fails
    if (overlap > best && !g.failing.empty()) best = overlap, closest = i;
    const bool same_rows = apart == 0;
    // Other rows than the engine's: named only by a serving operation both fail after (churn's plan
    // names several at once, so it does not count alone).
    const bool by_operation = std::any_of(shared.begin(), shared.end(), [](const std::string& n) {
      return n != check::kChurn && row_ops().count(n) > 0;
    });
    if (!same_rows && !by_operation) continue;
    // The signature, row by row (diagnose.h), on the rows both fail.
    bool holds = true, exact = true, same_positions = true;
    int placed = 0;
    std::string differs;
    auto differ = [&](const std::string& why) {
      if (differs.empty()) differs = why;
    };
    double far = 0, far_steps = 0;
    for (const auto& n : shared) {
      const RowSeen& e = engine.rows.at(n);
      const RowSeen& f = g.rows.at(n);
      double apart = 0;
      auto ratio = [&](const std::optional<double>& a, const std::optional<double>& b, double weight) {
        if (a && b && *a > 0 && *b > 0) apart = std::max(apart, weight * std::abs(std::log(*a / *b)));
      };
      ratio(f.size, e.size, 1.0);
      ratio(f.worst, e.worst, 1.0);
      ratio(f.kl, e.kl, 0.5);  // KL goes as a |diff| squared
      far = std::max(far, apart);
      if (e.first && f.first && *e.first != *f.first) {
        same_positions = false;
        if (!engine_placed.count(n)) exact = false;  // where the engine placed the operation, positions only rank
      }
      if (!e.op.empty() && !f.op.empty()) {
        // Churn: the operations between the row's last right logits and its first wrong ones, on both
        // sides; the bug's is among them, so they must share one (the same set ranks first). Its
        // positions and magnitudes follow the engine's schedule and storage: they only rank.
        ++placed;
        if (!shares_one(e.op, f.op)) holds = false, differ(n + " after " + f.op);
        if (e.op != f.op) exact = false;
        continue;
      }
      if (engine_placed.count(n)) {  // the operation is the row's own; where it parts is the engine's choice
        ++placed;
        continue;
      }
      // Every other row runs the check's own schedule: the same first position, a like |diff| there and
      // at the row's worst (within kFactor), the same peak when the error grew well past its first |diff|.
      if (e.first && f.first) {
        ++placed;
        if (*e.first != *f.first) holds = false, differ(n + " first at " + std::to_string(*f.first));
      }
      far_steps = std::max(far_steps, apart);
      if (apart > std::log(kFactor)) differ(n + " by a |diff| " + std::to_string(static_cast<int>(std::lround(std::exp(apart)))) + " times apart");
      auto grew = [](const RowSeen& x) { return x.worst && x.size && x.worst_at && *x.worst > 2 * *x.size; };
      if (e.first && grew(f) && grew(e)) {
        const int64_t slack = std::max<int64_t>(4, (*e.worst_at - *e.first) / 3);
        if (std::abs(*f.worst_at - *e.worst_at) > slack)
          far_steps = std::max(far_steps, 1e9), differ(n + " peaking at " + std::to_string(*f.worst_at));
      }
    }
    std::string rows_differ;
    if (!only_fault.empty()) rows_differ = "on our model it also fails " + join(only_fault) + ", which the engine passed";
    if (!only_engine.empty())
      rows_differ += (rows_differ.empty() ? "" : "; ") + std::string("the engine also fails ") + join(only_engine) +
                     ", which it passes on our model";
    Candidate c{faults[i]->name, shared, apart, rows_differ, exact, same_positions};
    if (placed == 0) {
      if (same_rows) unplaced.push_back(c.name);
    } else if (holds && far_steps <= std::log(kFactor)) {
      c.far = far;
      same_signature.push_back(std::move(c));
    } else if (same_rows) {
      c.far = std::max(far, far_steps);
      c.differs = differs;
      resembling.push_back(std::move(c));
    }
  }
  std::sort(same_signature.begin(), same_signature.end());
  std::sort(resembling.begin(), resembling.end());
  for (const auto& c : same_signature) d.matches.push_back(c.name);
  const std::string where = positions(engine, order);
  std::string saw;  // what the engine showed, row by row
  for (const auto& n : order) saw += (saw.empty() ? "" : "; ") + saw_in(n, engine.rows.at(n), context);
  d.saw = saw;
  d.text = "the failing rows (" + join(order) + (where.empty() ? "" : "; first over the bound at: " + where) + ") ";
  if (!d.matches.empty()) {
    const std::string& m = d.matches.front();
    const CacheVariant& f = cache_registry().get(m);
    const Candidate& c = same_signature.front();
    d.differs = c.rows_differ;
    std::string saw_shared;  // what the engine showed in the rows both fail
    for (const auto& n : c.shared) saw_shared += (saw_shared.empty() ? "" : "; ") + saw_in(n, engine.rows.at(n), context);
    d.text += "match the fault " + m + " on our model: " +
              (c.same_rows() ? "the same rows fail with the same signature (" + saw + ")"
                           : "the rows both fail have the same signature (" + saw_shared + "), though " + c.rows_differ) +
              (c.same_positions ? ", first at the same positions" : "") + "; " + (f.remedy.empty() ? f.description : f.remedy);
    if (d.matches.size() > 1) {
      d.text += " (the same signature, by magnitudes further from the engine's: " +
                join(std::vector<std::string>(d.matches.begin() + 1, d.matches.end())) + ")";
    }
    return d;
  }
  d.text += "match no known fault. What they show: " + saw + ".";
  if (!resembling.empty()) {
    d.closest = resembling.front().name;
    std::vector<std::string> names;
    for (const auto& c : resembling) names.push_back(c.name + " (" + c.differs + ")");
    d.text += " Failing these rows on our model, with another signature: " + join(names) + " - another bug of the same rows.";
  } else if (!unplaced.empty()) {
    d.closest = unplaced.front();
    d.text += " " + join(unplaced) + " fail" + (unplaced.size() > 1 ? "" : "s") +
              " the same rows on our model, but neither side names a position where they part, so nothing tells them "
              "apart (another bug of the same operation, or that one)";
  } else if (closest < faults.size()) {
    d.closest = faults[closest]->name;
    std::vector<std::string> fails;
    for (const auto& c : model_checks())
      if (got[closest].failing.count(c.name)) fails.push_back(c.name);
    const std::string at = positions(got[closest], fails);
    d.text += " The closest, " + d.closest + " - " + faults[closest]->description + " - fails " + join(fails) +
              (at.empty() ? "" : ", first at: " + at) + ".";
  }
  return d;
}

}  // namespace tinygpt::checks
