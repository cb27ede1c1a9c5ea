#include "tinygpt/checks/verify.h"

#include "tinygpt/checks/faults.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "tinygpt/checks/check_names.h"
#include "tinygpt/checks/parallel_runs.h"
#include "tinygpt/kv_cache.h"
#include "tinygpt/laws/selfcheck.h"

namespace tinygpt::checks {

namespace {

struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

CheckResult matrix_row(const InjectionReport& rep) {
  CheckResult r;
  r.name = "fault-matrix";
  // A fault this model cannot show (its effect within the model's own noise: inject.h) neither fails nor
  // passes: the row counts the observable ones and names the others, with why.
  const int observable = rep.observable(), inert = static_cast<int>(rep.faults.size()) - observable;
  r.status = observable == 0 ? Status::Skipped : rep.faults_passed() ? Status::Pass : Status::Fail;
  r.figure = rep.caught();
  r.detail = observable == 0 ? "no planted fault can show on this model"
                             : std::to_string(rep.caught()) + "/" + std::to_string(observable) + " faults caught" +
                                   (inert > 0 ? " (" + std::to_string(inert) + " of " + std::to_string(rep.faults.size()) +
                                                    " not observable on this model)"
                                              : "");
  r.stats["faults"] = static_cast<double>(rep.faults.size());
  r.stats["observable"] = observable;
  for (const auto& f : rep.faults) {
    for (const auto& c : f.checks) r.seconds += c.seconds;
    if (!f.observable) r.detail += "; " + f.fault + " " + f.inert_text();
    else if (!f.caught()) r.detail += "; " + f.fault + " MISSED by every check" + (f.errors().empty() ? "" : " (" + f.errors().front() + " erred)");
    else if (!f.missed_expected().empty()) r.detail += "; " + f.fault + " MISSED by " + f.missed_expected().front();
    if (f.seed_drift)  // the seed's own faults: the drift it measured, beside ours
      r.detail += "; " + f.fault + " drifts after " + (f.drift_after ? std::to_string(*f.drift_after) : "never/" + std::to_string(f.drift_window));
  }
  return r;
}

// A low-precision cache's row: its verdict by the budget, the largest mean KL of its rows and where.
CheckResult budget_row(const EquivalenceResult& e, const CacheVariant& v, const KvCost& kv) {
  CheckResult r;
  r.name = "kv-budget [" + v.name + "]";
  r.status = worst(e.checks);
  if (r.status == Status::Pass && !kv.passed()) r.status = Status::Fail;
  double kl = 0, kl_max = 0, top1 = 1;
  std::string where, names;
  for (const auto& c : e.checks) {
    r.seconds += c.seconds;
    names += (names.empty() ? "" : ", ") + c.name;
    auto at = [&](const char* k) { const auto it = c.stats.find(k); return it == c.stats.end() ? -1.0 : it->second; };
    if (at("kl_mean") > kl) kl = at("kl_mean"), where = c.name;
    kl_max = std::max(kl_max, at("kl_max"));
    if (at("top1_agreement") >= 0) top1 = std::min(top1, at("top1_agreement"));
  }
  r.figure = kl;
  char b[96];
  std::snprintf(b, sizeof b, ", top-1 agreement %.1f%%", 100 * top1);
  r.detail = "mean KL per step <= " + sci(*v.kv_budget) + " on " + names + ": largest " + sci(kl) + " (" + where +
             "), worst single step " + sci(kl_max) + b + "; teacher-forced against the same kernels with an fp32 cache: " +
             kv_stats_text(kv.vs_baseline) + (kv.passed() ? "" : " (over the budget)");
  r.stats["kl_mean_vs_fp32_cache"] = kv.vs_baseline.kl_mean();
  if (const auto over = kv.first_over_budget()) r.stats["first_kl_over_vs_fp32_cache"] = static_cast<double>(*over);
  for (const auto& c : e.checks)
    if (!c.ok()) {
      r.detail = c.name + ": " + c.detail;
      break;
    }
  return r;
}

}  // namespace

CheckResult summary_row(const EquivalenceResult& c, const std::string& name) {
  CheckResult r;
  r.name = name;
  r.status = worst(c.checks);
  for (const auto& s : c.checks) r.seconds += s.seconds;
  r.figure = std::max(c.loop_band.worst, c.forced_band.worst);
  std::string fig = "first " + std::to_string(std::min(c.identical_prefix, c.must_match)) + " of " +
                    std::to_string(c.must_match) + " tokens identical";
  if (c.first_difference) fig += ", first difference at " + std::to_string(*c.first_difference) + " of " + std::to_string(c.sequence_length);
  char b[128];
  std::snprintf(b, sizeof b, "; worst logit diff %.1e (tol %.0e); %zu checks", *r.figure, c.tolerance, c.checks.size());
  r.detail = fig + b;
  for (const auto& s : c.checks)
    if (!s.ok()) {
      r.detail = s.name + ": " + s.detail;
      break;
    }
  return r;
}

namespace {

// The golden uncached run's ids (1, T0 + tokens) when `dir` has one for this prompt and length: the
// reference's guess, which lets its uncached steps run side by side (build_reference checks every
// step's choice against it, so a stale golden costs time, never a wrong reference). Undefined otherwise.
at::Tensor golden_guess(const std::string& dir, const at::Tensor& prompt, int64_t tokens) {
  std::ifstream in(dir + "/greedy_600.json");
  if (dir.empty() || !in) return {};
  try {
    const nlohmann::json doc = nlohmann::json::parse(in);
    for (const auto& row : doc.at("rows")) {
      if (row.at("name") != "uncached") continue;
      const auto ids = row.at("ids").get<std::vector<int64_t>>();
      const at::Tensor g = at::tensor(ids, at::kLong).unsqueeze(0);  // (1, T0 + n)
      if (g.size(1) < prompt.size(1) + tokens || prompt.size(0) != 1) return {};
      const at::Tensor head = g.narrow(1, 0, prompt.size(1) + tokens);
      return head.narrow(1, 0, prompt.size(1)).equal(prompt.to(at::kCPU)) ? head : at::Tensor();
    }
  } catch (const std::exception&) {  // a malformed golden file is the golden rows' to report
  }
  return {};
}

}  // namespace

namespace {

using Say = std::function<void(const std::string&)>;

// What verify will run, decided before anything runs.
struct VerifyPlan {
  std::vector<std::string> rows;                // the selected rows, in the table's order
  std::vector<CacheVariant> faults;             // each fault cut to the selected rows (and, by default, to its own)
  std::vector<std::string> left_out;            // a line per fault none of whose catching rows is selected
  std::vector<const CacheVariant*> production;  // every production cache: the negative controls
  std::vector<const CacheVariant*> budgeted;    // the low-precision caches; none when no logit row is selected
  std::vector<std::string> budget_rows;         // the logit rows they run, judged by their KL budgets
  EquivalenceOptions main;                      // batch 1: the main prompt, the run's tokens
  EquivalenceOptions batch3;                    // a batch of three different prompts through every check
  InjectionOptions injection;                   // the matrix's lengths (its controls and reference set when it runs)
  bool goldens = false;                         // golden files beside the model
  bool reuse_uncached = false;                  // the series' golden uncached run is the reference's own (600 tokens)
  std::string tolerance_note;                   // how the logit bound was chosen, when not the default
};

// The rows (validating --checks), each fault narrowed to them, the caches, the runs' options.
VerifyPlan plan_verify(const Fixture& fx, const VerifyOptions& o) {
  VerifyPlan plan;
  // The production caches run every row but the engine-only ones (self: our prefill is what
  // logits compares with): the default set, what serving engines do to a cache, batch sizes 1-8, 15-17 and 31-33.
  // The rows of statistical power (Tag::Deep) only with --deep or by name: minutes of draws on two cores.
  const std::vector<std::string> every_row = model_checks_with(0, static_cast<Tags>(Tag::EngineOnly));
  plan.rows = o.deep ? every_row : model_checks_with(0, Tag::EngineOnly | Tag::Deep);
  if (!o.deep && o.checks.empty())
    for (const auto& n : model_checks_with(static_cast<Tags>(Tag::Deep)))
      plan.left_out.push_back("row " + n + " left out: its draws take minutes (tinygpt verify --deep runs it)");
  if (!o.checks.empty()) {
    for (const auto& n : o.checks)
      if (std::find(every_row.begin(), every_row.end(), n) == every_row.end())
        throw std::invalid_argument("--checks: '" + n + "' is not a row verify runs (" + join(every_row) + ")");
    plan.rows.clear();  // in the table's order, whatever the order asked
    for (const auto& n : every_row)
      if (std::find(o.checks.begin(), o.checks.end(), n) != o.checks.end()) plan.rows.push_back(n);
  }
  auto selected = [&](const std::string& n) { return std::find(plan.rows.begin(), plan.rows.end(), n) != plan.rows.end(); };
  // The faults stated for this model (the low-precision caches' included, each judged by its cache's
  // budget), from the table or from the caller's list.
  const Config& cfg = fx.model->config();
  const FaultChoice chosen = faults_for(cfg, FaultUse::Matrix, o.faults ? &*o.faults : nullptr);
  const std::vector<const CacheVariant*>& faults = chosen.faults;
  plan.left_out.insert(plan.left_out.end(), chosen.left_out.begin(), chosen.left_out.end());
  // Each fault's run cut to the selected rows and, without --full-matrix, to the rows that must
  // catch it and the shared greedy run (`tokens`); a fault none of whose catching rows is selected
  // is left out.
  for (const CacheVariant* f : faults) {
    if (std::none_of(f->expected.begin(), f->expected.end(), selected)) {
      plan.left_out.push_back("fault " + f->name + " left out: none of the rows that must catch it (" + join(f->expected) +
                              ") is selected");
      continue;
    }
    auto gates = [&](const std::string& n) {
      return o.full_matrix || n == check::kTokens || std::find(f->expected.begin(), f->expected.end(), n) != f->expected.end();
    };
    CacheVariant v = *f;
    const auto own = f->checks.empty() ? model_checks_with(static_cast<Tags>(Tag::Default)) : f->checks;
    v.checks.clear();
    for (const auto& n : own)
      if (selected(n) && gates(n)) v.checks.push_back(n);
    v.expected.erase(std::remove_if(v.expected.begin(), v.expected.end(), [&](const std::string& n) { return !selected(n); }),
                     v.expected.end());
    plan.faults.push_back(std::move(v));
  }
  plan.goldens = !fx.dir.empty() && std::ifstream(fx.dir + "/sample_grid.json").good();
  // The caches that hold this model; a fast cache that implements the seed's architecture only says so.
  auto runnable = [&](std::vector<const CacheVariant*> vs) {
    std::vector<const CacheVariant*> out;
    for (const CacheVariant* v : vs) {
      const std::string why = v->unsupported(cfg);
      if (why.empty()) out.push_back(v);
      else plan.left_out.push_back("cache " + v->name + " left out: " + why);
    }
    return out;
  };
  plan.production = runnable(cache_registry().all(/*faults=*/false));
  for (const auto& n : model_checks_with(static_cast<Tags>(Tag::Budget)))  // the logit rows, against our fp32 model
    if (selected(n)) plan.budget_rows.push_back(n);
  if (!plan.budget_rows.empty()) plan.budgeted = runnable(cache_registry().budgeted(/*faults=*/false));

  const c10::Device dev = o.device;
  plan.main.prompt = main_prompt(dev);
  plan.main.tokens = o.tokens;
  plan.main.require_batch_invariance = o.require_batch_invariance;
  plan.main.require_thread_invariance = o.require_thread_invariance;
  if (o.tolerance) {
    plan.main.tolerance.logits = plan.main.tolerance.self = *o.tolerance;
    plan.main.tolerance.why = "--tolerance";
  } else {
    // The default bound is fp32 noise on the seed's model; a model whose own arithmetic is noisier (deeper,
    // larger logits: kNoiseFloorTrigger times its floor over the bound) is judged at kNoiseFloorMargin
    // times its measured floor, and says so. The self bound (a target against itself) is raised alike.
    GPT m = fx.model;
    const double floor = fp32_noise_floor(m);
    if (kNoiseFloorTrigger * floor > kLogitTolerance) {
      const double raised = kNoiseFloorMargin * floor, unit = std::pow(10.0, std::floor(std::log10(raised)));
      const double bound = std::ceil(raised / unit) * unit;  // rounded up to one significant digit
      plan.main.tolerance.logits = plan.main.tolerance.self = bound;
      plan.main.tolerance.why = "raised from " + sci(kLogitTolerance) + ": " + std::to_string(static_cast<int>(kNoiseFloorMargin)) +
                                "x this model's own fp32 noise (a correct cache's steps beside another row against its full forward: " +
                                sci(floor) + "); --tolerance sets it";
      plan.tolerance_note = "logit bound " + sci(bound) + ", " + plan.main.tolerance.why;
    }
  }
  if (o.inside_context) {
    plan.main.past_window = false;
    plan.main.inside_window_why = "--quick";
    if (o.tokens > fx.model->config().context)
      throw std::invalid_argument("--quick keeps every run inside the context of " + std::to_string(fx.model->config().context) +
                                  " tokens: --tokens " + std::to_string(o.tokens) + " is past it");
  }
  plan.main.draft = fx.draft;  // the speculative rows' trained draft, when the fixture has one
  validate(plan.main);
  const int64_t vocab = fx.model->config().vocab_size;
  plan.batch3.prompt = at::tensor(std::vector<int64_t>{1, 2, 3, 17, 250, 9, 400, 33, 1024}, at::kLong).view({3, 3}).remainder(vocab).to(dev);
  plan.batch3.tokens = std::min<int64_t>(o.tokens, 96);
  plan.batch3.tolerance = plan.main.tolerance;
  plan.reuse_uncached = o.tokens == 600;
  // Faults: past the window by 16 (every past-window fault shows at position context or context + 1),
  // and 48 tokens for their batch, sampled, ragged, join-leave and fork checks (the faults those are
  // for show at once; rollback keeps crossing the window's edge, where its past-window fault shows).
  plan.injection.fault_tokens = std::min(o.tokens, fx.model->config().context + 16);
  plan.injection.fault_side_tokens = 48;
  plan.injection.control_checks = plan.rows;
  return plan;
}

// What the runs produced, before it becomes the report's rows.
struct VerifyRuns {
  std::vector<std::vector<CheckResult>> batch3;   // per production cache: its batch-of-three row
  std::vector<std::vector<CheckResult>> goldens;  // per production cache: its golden rows
  InjectionReport matrix;
  std::vector<EquivalenceResult> budgeted;  // per low-precision cache
  std::vector<KvCost> kv;                   // per low-precision cache
  std::vector<CheckResult> sampler;
};

// The runs, side by side on the CPU (parallel_runs.h), in two phases around the reference.
VerifyRuns schedule_verify(Fixture& fx, const VerifyPlan& plan, const VerifyOptions& o, const Say& say) {
  const c10::Device dev = o.device;
  const auto& production = plan.production;
  VerifyRuns runs;
  runs.batch3.resize(production.size());
  runs.goldens.resize(production.size());
  const int workers = default_workers(dev);
  // Phase 1: the reference's uncached steps (from the golden run's ids, side by side) and, beside
  // them, what needs no reference of the main run: the batch of three (its own reference) and the
  // goldens of the caches whose golden rows are cached runs only.
  std::optional<Reference> kept = load_cached_reference(fx.model, plan.main.prompt, plan.main.tokens);  // TINYGPT_REFERENCE_CACHE
  const bool spans = !kept && workers > 1;
  GuessedReference guessed(fx.model, plan.main.prompt, plan.main.tokens,
                           spans ? golden_guess(fx.dir, plan.main.prompt, plan.main.tokens) : at::Tensor(), spans ? 3 : 0);
  auto goldens = [&](size_t k, const Reference* uncached) {
    const CacheVariant* v = production[k];
    Timer pt;  // the golden rows share their run's time (the batch row carries its checks' own)
    auto gs = verify_goldens(fx, dev, v->name == kSeriesCache ? nullptr : v, uncached);
    const double each = pt.seconds() / static_cast<double>(std::max<size_t>(1, gs.size()));
    for (auto& g : gs) {
      g.name = "golden:" + g.name;
      g.seconds = each;
      runs.goldens[k].push_back(std::move(g));
    }
    say("goldens through " + v->name + " checked");
  };
  std::vector<size_t> early_goldens;  // the caches whose goldens need no uncached run
  if (plan.goldens)
    for (size_t k = 0; k < production.size(); ++k)
      if (production[k]->name != kSeriesCache) early_goldens.push_back(k);
  say("reference: uncached greedy run, full-forward and banded logits" +
      std::string(kept ? " (kept from an earlier run: TINYGPT_REFERENCE_CACHE)"
                       : guessed.spans() ? " (its steps side by side from the golden run's ids)" : ""));
  // The batch of three first: its reference and both caches' checks are the longest job (on two
  // workers the spans then fill in beside it and the phase ends when the last span does).
  run_in_parallel(guessed.spans() + 1 + early_goldens.size(), workers, [&](size_t job) {
    if (job > 0 && job <= guessed.spans()) return guessed.run_span(job - 1);
    if (job == 0) {
      say("a batch of 3 prompts: reference");
      const Reference bref = build_reference(fx.model, plan.batch3);
      for (size_t k = 0; k < production.size(); ++k) {
        runs.batch3[k].push_back(summary_row(check_equivalence(fx.model, plan.batch3, bref, *production[k]),
                                             "cache-equivalence [" + production[k]->name + ", batch 3]"));
        say("a batch of 3 prompts: " + production[k]->name + " checked");
      }
      return;
    }
    goldens(early_goldens[job - guessed.spans() - 1], nullptr);
  });
  if (!kept) {
    kept = guessed.finish();
    store_cached_reference(fx.model, plan.main.prompt, plan.main.tokens, *kept);
  }
  const Reference ref = std::move(*kept);

  // Phase 2: batch 1, every production cache (the negative controls) at the seed's 600 tokens, and
  // every fault through the rows that must catch it at context + 16 tokens; beside them in the same
  // pool, each low-precision cache's logit rows at the main run's length (judged by its KL budget)
  // and the goldens that reuse the reference's uncached run.
  InjectionOptions io = plan.injection;
  io.controls = production;
  io.reference = &ref;
  const auto& budgeted = plan.budgeted;
  runs.budgeted.resize(budgeted.size());
  runs.kv.resize(budgeted.size());
  for (size_t job = 0; job < budgeted.size(); ++job)
    io.beside.push_back([&, job] {
      const CacheVariant* v = budgeted[job];
      ModelTarget target(fx.model, *v);
      runs.budgeted[job] = run_checks(fx.model, judged_as(plan.main, *v), target, plan.budget_rows, &ref);
      // The second reference: the same arithmetic with an fp32 cache (the series' cache at its kernels).
      CacheVariant twin = *v;
      twin.name = v->name + " with an fp32 cache";
      twin.make_cache = [](const Config& c) { return std::make_unique<RollingKVCache>(c); };
      twin.make_step = nullptr;
      twin.kv_budget.reset();
      ModelTarget fp32(fx.model, twin);
      runs.kv[job] = kv_cost_of(v->name, "f32", forced_logits(target, plan.main.prompt, plan.main.tokens, ref),
                                forced_logits(fp32, plan.main.prompt, plan.main.tokens, ref), ref, plan.main.prompt.size(1),
                                *v->kv_budget, std::nullopt, kLogitTolerance);
      say("low-precision cache " + v->name + " checked (mean KL budget " + sci(*v->kv_budget) + ")");
    });
  if (plan.goldens)
    for (size_t k = 0; k < production.size(); ++k)
      if (production[k]->name == kSeriesCache) io.beside.push_back([&, k] { goldens(k, plan.reuse_uncached ? &ref : nullptr); });
  std::vector<const CacheVariant*> faults;
  for (const auto& v : plan.faults) faults.push_back(&v);
  runs.matrix = run_injection(fx.model, plan.main, faults, io, say);

  say("sampler self-check");
  Timer t;
  runs.sampler = props::seed_selfcheck(props::production_sampler().pick, dev);
  for (auto& s : runs.sampler) {
    s.name = "sampler:" + s.name;
    s.seconds = t.seconds() / static_cast<double>(runs.sampler.size());
  }
  return runs;
}

// The report: the controls' rows, the matrix's, every batch-of-three row, every golden row, each
// low-precision cache's row, the sampler's.
VerifyReport assemble_verify(const VerifyPlan& plan, VerifyRuns runs) {
  VerifyReport rep;
  rep.goldens_found = plan.goldens;
  for (const auto& c : runs.matrix.controls) rep.rows.push_back(summary_row(c, "cache-equivalence [" + c.cache + "]"));
  if (!plan.faults.empty()) rep.rows.push_back(matrix_row(runs.matrix));
  for (const auto* group : {&runs.batch3, &runs.goldens})
    for (const auto& rows : *group) rep.rows.insert(rep.rows.end(), rows.begin(), rows.end());
  for (size_t b = 0; b < plan.budgeted.size(); ++b) rep.rows.push_back(budget_row(runs.budgeted[b], *plan.budgeted[b], runs.kv[b]));
  rep.rows.insert(rep.rows.end(), runs.sampler.begin(), runs.sampler.end());
  rep.matrix = std::move(runs.matrix);
  rep.budgeted = std::move(runs.budgeted);
  rep.kv = std::move(runs.kv);
  return rep;
}

}  // namespace

VerifyReport run_verify(Fixture& fx, const VerifyOptions& o) {
  const Say say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  const VerifyPlan plan = plan_verify(fx, o);
  for (const auto& line : plan.left_out) say(line);
  if (!plan.tolerance_note.empty()) say(plan.tolerance_note);
  if (plan.goldens) say("goldens in " + fx.dir);
  else say("no golden files for this model: golden checks skipped (record them with `tinygpt golden update`)");
  return assemble_verify(plan, schedule_verify(fx, plan, o, say));
}

}  // namespace tinygpt::checks
