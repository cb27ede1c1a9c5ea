#include "tinygpt/checks/inject.h"

#include "tinygpt/checks/cache_registry.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "tinygpt/checks/parallel_runs.h"
#include "tinygpt/checks/target.h"

namespace tinygpt::checks {

bool FaultOutcome::ran(const std::string& check) const {  // a skipped row never ran: it can neither catch nor miss
  return std::any_of(checks.begin(), checks.end(), [&](const CheckResult& c) { return c.name == check && c.status != Status::Skipped; });
}

std::vector<std::string> InjectionReport::check_names() const {
  std::vector<std::string> out;
  for (const auto& name : tinygpt::checks::check_names()) {
    bool used = false;
    for (const auto& f : faults) used |= f.ran(name);
    if (faults.empty())
      for (const auto& c : controls)
        used |= std::any_of(c.checks.begin(), c.checks.end(), [&](const CheckResult& r) { return r.name == name; });
    if (used) out.push_back(name);
  }
  return out;
}

bool FaultOutcome::caught() const {
  return std::any_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.failed(); });
}

bool FaultOutcome::caught_by(const std::string& check) const {
  for (const auto& c : checks)
    if (c.name == check) return c.failed();
  return false;
}

std::vector<std::string> FaultOutcome::errors() const {
  std::vector<std::string> out;
  for (const auto& c : checks)
    if (c.status == Status::Error) out.push_back(c.name);
  return out;
}

std::vector<std::string> FaultOutcome::missed_expected() const {
  std::vector<std::string> out;
  for (const auto& e : expected)
    if (ran(e) && !caught_by(e)) out.push_back(e);
  return out;
}

std::string FaultOutcome::inert_text() const {
  return "not observable on this model (largest effect " + sci(effect) + " against the model's own noise " + sci(noise) + " over the same rows" +
         (inert_why.empty() ? "" : ": " + inert_why) + ")";
}

int InjectionReport::observable() const {
  return static_cast<int>(std::count_if(faults.begin(), faults.end(), [](const FaultOutcome& f) { return f.observable; }));
}

int InjectionReport::caught() const {
  return static_cast<int>(std::count_if(faults.begin(), faults.end(), [](const FaultOutcome& f) { return f.caught(); }));
}

bool InjectionReport::controls_passed() const {
  return std::all_of(controls.begin(), controls.end(), [](const EquivalenceResult& c) { return c.passed(); });
}

bool InjectionReport::faults_passed() const {
  return std::all_of(faults.begin(), faults.end(),
                     [](const FaultOutcome& f) { return !f.observable || (f.caught() && f.missed_expected().empty()); });
}

bool InjectionReport::passed() const { return controls_passed() && faults_passed(); }

namespace {

// A logit row's largest |diff| (its figure, or its max_abs_diff), for the rows whose figure is one: those
// judged against a reference, the target's own prefill, its earlier run or the row alone. Nothing for a
// row judged by ids or a law (passing, it saw no effect). Asked only of runs judged by |diff| bounds.
std::optional<double> logit_effect(const CheckResult& c) {
  if (c.status == Status::Skipped) return std::nullopt;
  Judge j;
  try {
    j = find_check(c.name).judge;
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (j == Judge::Tokens || j == Judge::Law) return std::nullopt;
  if (const auto it = c.stats.find("max_abs_diff"); it != c.stats.end()) return it->second;
  return c.figure;
}

// The largest logit effect of one run: its logit rows and its production and teacher-forced steps.
double largest_effect(const EquivalenceResult& r) {
  double worst = 0;
  for (const auto& c : r.checks)
    if (const auto e = logit_effect(c)) worst = std::max(worst, *e);
  for (const StepDiffs* d : {&r.loop_full, &r.loop_band, &r.forced_full, &r.forced_band}) worst = std::max(worst, d->worst);
  return worst;
}

}  // namespace

InjectionReport run_injection(GPT& model, const EquivalenceOptions& opts,
                              const std::vector<const CacheVariant*>& faults, const InjectionOptions& io,
                              const std::function<void(const std::string&)>& progress) {
  std::mutex say_mu;
  auto say = [&](const std::string& s) {
    std::lock_guard<std::mutex> lock(say_mu);
    if (progress) progress(s);
  };
  std::vector<const CacheVariant*> controls = io.controls;
  if (controls.empty())  // every production cache that holds this model (a fast cache refuses a zoo member)
    for (const CacheVariant* v : cache_registry().all(/*faults=*/false))
      if (v->unsupported(model->config()).empty()) controls.push_back(v);
  if (io.fault_tokens < 0 || io.fault_tokens > opts.tokens)
    throw std::invalid_argument("inject: fault tokens must be in [0, " + std::to_string(opts.tokens) + "]");
  if (io.workers < 0) throw std::invalid_argument("inject: workers must be >= 0");
  EquivalenceOptions fopts = opts;
  if (io.fault_tokens > 0) fopts.tokens = io.fault_tokens;
  if (io.fault_side_tokens < 0) throw std::invalid_argument("inject: fault side tokens must be >= 0");
  if (io.fault_side_tokens > 0)
    fopts.batch_tokens = fopts.sampled_tokens = fopts.serving_tokens = std::min(io.fault_side_tokens, fopts.tokens);
  const int64_t drift_tokens = std::min(io.drift_tokens, fopts.tokens);
  Reference built;
  if (!io.reference) {
    say("reference: uncached greedy run, full-forward and banded logits");
    built = build_reference(model, opts);
  }
  const Reference& ref = io.reference ? *io.reference : built;
  const Reference fref = fopts.tokens == opts.tokens ? ref : ref.prefix(fopts.tokens);

  // Every control and fault is one run; the controls (longest) first, then the faults in order.
  const size_t runs = controls.size() + faults.size(), B = io.beside.size();
  std::vector<EquivalenceResult> results(runs);
  std::atomic<size_t> faults_done{0};
  run_in_parallel(runs + B, io.workers > 0 ? io.workers : default_workers(opts.prompt.device()), [&](size_t job) {
    if (job >= controls.size() && job < controls.size() + B) return io.beside[job - controls.size()]();
    const size_t i = job < controls.size() ? job : job - B;
    if (i < controls.size()) {
      say("negative control: " + controls[i]->name);
      ModelTarget target(model, *controls[i]);
      results[i] = run_checks(model, opts, target, io.control_checks, &ref);
      return;
    }
    const CacheVariant* v = faults[i - controls.size()];
    ModelTarget target(model, *v);
    results[i] = run_checks(model, judged_as(fopts, *v), target, v->checks, &fref);
    say("fault " + std::to_string(++faults_done) + "/" + std::to_string(faults.size()) + " checked: " + v->name);
  });

  InjectionReport rep;
  for (size_t i = 0; i < controls.size(); ++i) rep.controls.push_back(std::move(results[i]));
  // The model's own noise: the production caches' largest effect over their rows (a missed fault's is
  // measured against it).
  double noise = 0;
  for (const auto& c : rep.controls) noise = std::max(noise, largest_effect(c));
  // The seed's drift measure compares a fault's greedy output with the correct cached output.
  const at::Tensor correct = rep.controls.empty() ? at::Tensor() : rep.controls.front().produced;
  for (size_t k = 0; k < faults.size(); ++k) {
    const CacheVariant* v = faults[k];
    const EquivalenceResult& r = results[controls.size() + k];
    FaultOutcome f;
    f.fault = v->name;
    f.description = v->description;
    f.expected = v->expected;
    f.drift_window = drift_tokens;
    f.checks = r.checks;
    f.step_diffs = r.loop_band.diffs;
    std::optional<int64_t> first;
    for (const StepDiffs* d : {&r.loop_full, &r.loop_band, &r.forced_full, &r.forced_band}) {
      f.worst_logit_diff = std::max(f.worst_logit_diff, d->worst);
      if (d->first_position_over && (!first || *d->first_position_over < *first)) first = d->first_position_over;
    }
    f.first_logit_position_over = first;
    f.seed_drift = v->seed_drift;
    // Observable? Asked of a fault no row caught and none erred on, every row that must catch it having
    // run (a skipped one saw nothing either way), judged by logits (a low-precision cache's fault is
    // judged by its budget: always observable).
    const bool by_distribution = opts.tolerance.by_distribution() || v->kv_budget.has_value();
    const bool all_ran = std::all_of(f.expected.begin(), f.expected.end(), [&](const std::string& e) { return f.ran(e); });
    if (!f.caught() && f.errors().empty() && all_ran && !by_distribution && !rep.controls.empty()) {
      f.effect_measured = true;
      f.effect = largest_effect(r);
      f.noise = noise;
      if (f.effect <= kInertMargin * f.noise) {
        f.observable = false;
        if (v->inert_on) f.inert_why = v->inert_on(model);
      }
    }
    f.drift_measured = r.main_attempted;
    if (!f.drift_measured) {
      // a serving fault's run makes no greedy main run: no drift to measure
    } else if (!r.produced.defined() || !correct.defined()) {
      f.drift_after = 0;  // it could not even generate
    } else {
      const int64_t parts = steps_before_parting(r.produced, correct, opts.prompt.size(1), drift_tokens);
      if (parts < drift_tokens) f.drift_after = parts;
    }
    rep.faults.push_back(std::move(f));
  }
  return rep;
}

FaultMatrix fault_matrix(const InjectionReport& r) {
  FaultMatrix m;
  m.checks = r.check_names();
  for (const auto& f : r.faults) {
    m.faults.push_back(&f);
    std::vector<MatrixCell> row;
    const auto errors = f.errors();
    for (const auto& c : m.checks) {
      MatrixCell cell;
      cell.expected = std::find(f.expected.begin(), f.expected.end(), c) != f.expected.end();
      cell.kind = f.caught_by(c)                                                  ? MatrixCell::Caught
                  : std::find(errors.begin(), errors.end(), c) != errors.end() ? MatrixCell::Error
                  : f.ran(c) && !f.observable                                  ? MatrixCell::Inert
                  : f.ran(c)                                                   ? MatrixCell::Missed
                                                                               : MatrixCell::NotRun;
      row.push_back(cell);
    }
    m.cells.push_back(std::move(row));
  }
  return m;
}

std::string cell_symbol(const MatrixCell& c) {
  switch (c.kind) {
    case MatrixCell::Caught: return c.expected ? "caught*" : "caught";
    case MatrixCell::Missed: return c.expected ? "MISSED*" : "missed";
    case MatrixCell::Error: return c.expected ? "ERROR*" : "error";
    case MatrixCell::NotRun: return "not run";
    case MatrixCell::Inert: return "n/o";
  }
  return "?";
}

const char* const kMatrixLegend =
    "caught: the check failed on the fault; missed: it ran and passed; error: it could not finish (never a catch); "
    "not run: not part of the fault's run; n/o: it passed on a fault this model cannot show (its effect within the model's own "
    "noise: neither a catch nor a miss); * marks a check the fault must be caught by (MISSED* and ERROR* fail the matrix)";

std::string format_injection(const InjectionReport& r) {
  std::ostringstream s;
  const FaultMatrix m = fault_matrix(r);
  // Every column as wide as its longest entry: the check's name or a cell's symbol.
  size_t fault_w = std::string("fault").size();
  for (const auto* f : m.faults) fault_w = std::max(fault_w, f->fault.size());
  std::vector<size_t> w;
  for (const auto& n : m.checks) w.push_back(std::max(n.size(), std::string("not run").size()));
  auto pad = [](const std::string& t, size_t width) { return t + std::string(width > t.size() ? width - t.size() : 0, ' '); };
  s << pad("fault", fault_w);
  for (size_t k = 0; k < m.checks.size(); ++k) s << " " << pad(m.checks[k], w[k]);
  s << "  errors  drift         first logit over tol (worst |diff|)\n";
  for (size_t i = 0; i < m.faults.size(); ++i) {
    const FaultOutcome& f = *m.faults[i];
    s << pad(f.fault, fault_w);
    for (size_t k = 0; k < m.checks.size(); ++k) s << " " << pad(cell_symbol(m.cells[i][k]), w[k]);
    const std::string drift = !f.drift_measured ? "-" : f.drift_after ? "after " + std::to_string(*f.drift_after)
                                                                      : "none/" + std::to_string(f.drift_window);
    char over[96];
    if (f.first_logit_position_over)
      std::snprintf(over, sizeof over, "pos %lld (%.2e)", static_cast<long long>(*f.first_logit_position_over), f.worst_logit_diff);
    else
      std::snprintf(over, sizeof over, "none (%.2e)", f.worst_logit_diff);
    char tail[64];
    std::snprintf(tail, sizeof tail, "  %6zu  %-12s  ", f.errors().size(), drift.c_str());
    s << tail << over << "\n";
  }
  if (!m.faults.empty()) s << kMatrixLegend << "\n";
  for (const auto& c : r.controls)
    s << "negative control (" << c.cache << "): " << (c.passed() ? "passes every check" : "FAILS") << "\n";
  int unexpected = 0;
  for (const auto& f : r.faults) unexpected += f.observable && !f.missed_expected().empty();
  for (const auto& f : r.faults)
    if (!f.observable) s << f.fault << ": " << f.inert_text() << "; it neither fails nor passes the matrix\n";
  for (const auto& f : r.faults)
    if (!f.errors().empty())
      s << f.fault << ": " << f.errors().size() << " check(s) could not finish (errors are not detections), first: "
        << f.errors().front() << "\n";
  s << "mutation score: " << r.caught() << "/" << r.observable() << " faults caught";
  if (r.observable() != static_cast<int>(r.faults.size()))
    s << " (the observable ones; " << r.faults.size() - static_cast<size_t>(r.observable()) << " of " << r.faults.size()
      << " not observable on this model)";
  if (unexpected) s << "; " << unexpected << " missed by a check that should catch them (MISSED*)";
  s << "\n";
  return s.str();
}

}  // namespace tinygpt::checks
