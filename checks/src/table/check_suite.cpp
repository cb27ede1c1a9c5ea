#include "tinygpt/checks/check_suite.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <stdexcept>

#include "tinygpt/checks/deviations.h"

namespace tinygpt::checks {

std::string tag_names(Tags tags) {
  static const std::pair<Tag, const char*> names[] = {
      {Tag::Default, "default"},         {Tag::Serving, "serving"},     {Tag::PastWindow, "past-window"},
      {Tag::OnlyPastWindow, "only-past-window"}, {Tag::NeedsScores, "needs-scores"}, {Tag::EngineOnly, "engine-only"},
      {Tag::Sampler, "sampler"}, {Tag::Budget, "budget"}, {Tag::Long, "long"}, {Tag::Deep, "deep"}};
  std::string s;
  for (const auto& [t, n] : names)
    if (has(tags, t)) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

std::string judge_text(Judge j) {
  switch (j) {
    case Judge::Tokens: return "greedy ids identical";
    case Judge::Reference: return "the reference tolerance (or --max-kl / --min-top1)";
    case Judge::Self: return "the self tolerance";
    case Judge::Repeat: return "the reference tolerance, against its own earlier run";
    case Judge::Invariance: return "the reference tolerance, against the row alone";
    case Judge::Law: return "the law's formula";
  }
  return "?";
}

const char* cost_name(Cost c) {
  switch (c) {
    case Cost::Shared: return "the main run";
    case Cost::Run: return "a run";
    case Cost::Runs: return "many runs";
    case Cost::Law: return "a property";
  }
  return "?";
}

const CheckResult* EquivalenceResult::check(const std::string& name) const {
  for (const auto& c : checks)
    if (c.name == name) return &c;
  return nullptr;
}

CheckContext::CheckContext(GPT& m, const EquivalenceOptions& o, DecodeTarget& t, EquivalenceResult& r, const Reference* shared)
    : model(m), opts(o), target(t), out(r), shared_(shared) {
  bound_.tol = o.tolerance;
  for (const auto& name : t.offers().deviations)
    if (const Deviation* d = find_deviation(name)) declared_.push_back(d);
}

const Reference& CheckContext::ref() {
  if (shared_) return *shared_;
  if (!own_ref_) own_ref_ = cached_reference(model, opts.prompt, opts.tokens);
  return *own_ref_;
}

const CheckDef& CheckContext::row() const {
  if (!row_) throw std::logic_error("CheckContext::row: no check is running");
  return *row_;
}

const Generation& CheckContext::main() {
  out.main_attempted = true;
  if (main_) return *main_;
  if (main_error_) throw std::runtime_error("the target's main run did not complete (see " + *main_error_ + ")");
  main_error_ = row_ ? row_->name : std::string("the first check");  // if the run throws, later checks point here
  if (!target.offers().takes_rows() && target.offers().why_not_speculate("none", AcceptRule::SampleAndMatch).empty()) {
    // A target that takes whole requests only: its own plain greedy loop (speculate with no drafts).
    SamplingSettings greedy_settings;
    greedy_settings.temperature = 0;
    main_ = target.seeded(opts.prompt, opts.tokens, greedy_settings, 0);
  } else {
    main_ = target.generate(opts.prompt, opts.tokens, greedy());
  }
  main_error_.reset();
  return *main_;
}

const StepReference& CheckContext::main_reference() {
  if (!main_ref_) {
    const Generation& m = main();
    const Reference& r = ref();
    main_ref_ = m.seq.to(r.uncached.device()).equal(r.uncached)
                    ? r.steps
                    : reference_for(model, m.seq.to(r.uncached.device()), opts.prompt.size(1), opts.tokens);
  }
  return *main_ref_;
}

RowBound CheckContext::bound_for(const CheckDef& def) const {
  RowBound b;
  b.tol = opts.tolerance;
  for (const Deviation* d : declared_) {
    if (!d->touches(def)) continue;
    if (std::find(d->voids.begin(), d->voids.end(), def.name) != d->voids.end()) {  // nothing to judge it by
      b.declared_by.push_back(d->name);
      continue;
    }
    if (d->max_kl && def.judge != Judge::Self) {  // judged by the distribution, unless the run chose a KL bound itself
      b.relaxed_by.push_back(d->name);
      if (!opts.tolerance.max_kl) b.tol.max_kl = std::max(b.tol.max_kl.value_or(0.0), *d->max_kl);
      continue;
    }
    const std::optional<double> wider = def.judge == Judge::Self ? d->self_tolerance : d->tolerance;
    if (!wider) {
      b.declared_by.push_back(d->name);
      continue;
    }
    b.relaxed_by.push_back(d->name);
    double& t = def.judge == Judge::Self ? b.tol.self : b.tol.logits;
    t = std::max(t, *wider);
  }
  return b;
}

void validate(const EquivalenceOptions& opts) {
  if (!opts.prompt.defined()) throw std::invalid_argument("equivalence: no prompt");
  if (opts.tokens < 1) throw std::invalid_argument("equivalence: --tokens must be >= 1");
  for (auto [v, what] : {std::pair{opts.batch_rows, "batch rows"}, {opts.long_tokens, "long-prompt tokens"},
                         {opts.reset_tokens, "reset tokens"}})
    if (v < 1) throw std::invalid_argument(std::string("equivalence: ") + what + " must be >= 1");
  opts.sampling.validate();
  if (opts.sampling.temperature == 0) throw std::invalid_argument("equivalence: the sampled check needs temperature > 0");
  const Tolerances& t = opts.tolerance;
  if (!(t.logits > 0) || !(t.self > 0)) throw std::invalid_argument("equivalence: tolerances must be > 0");
  if (opts.self_stride < 0) throw std::invalid_argument("equivalence: self stride must be >= 0 (0: the default choice of steps)");
  if (t.max_kl && !(*t.max_kl > 0)) throw std::invalid_argument("--max-kl must be > 0");
  if (t.min_top1 && !(*t.min_top1 > 0 && *t.min_top1 <= 1)) throw std::invalid_argument("--min-top1 must be in (0, 1]");
  for (int64_t b : opts.batch_sizes)
    if (b < 1) throw std::invalid_argument("--batch-sizes: every size must be >= 1 (got " + std::to_string(b) + ")");
  if (!std::is_sorted(opts.batch_sizes.begin(), opts.batch_sizes.end()) ||
      std::adjacent_find(opts.batch_sizes.begin(), opts.batch_sizes.end()) != opts.batch_sizes.end())
    throw std::invalid_argument("--batch-sizes: the sizes must be ascending, each once");
  if (opts.spec_draws < 0) throw std::invalid_argument("equivalence: the distribution row's draws must be >= 0 (0: its sized count)");
}

std::string options_key(const EquivalenceOptions& o) {
  std::ostringstream s;
  s.precision(17);
  auto ids = [&](const at::Tensor& t) {
    const at::Tensor c = t.to(at::kCPU).contiguous();
    s << "(" << c.size(0) << "x" << c.size(1) << ")";
    for (int64_t i = 0; i < c.numel(); ++i) s << c.data_ptr<int64_t>()[i] << ",";
  };
  s << "prompt ";
  ids(o.prompt);
  s << " tokens " << o.tokens << " batch " << o.batch_rows << "/" << o.batch_tokens << "/" << o.batch_stride << " sampling "
    << o.sampling.to_string() << " seed " << o.sampling_seed << "/" << o.sampled_tokens << " long " << o.long_extra << "/"
    << o.long_tokens << " reset " << o.reset_tokens << " serving " << o.serving_tokens << " self " << o.self_stride << " invariance "
    << o.require_batch_invariance << o.require_thread_invariance << " threads";
  for (int t : o.thread_counts) s << " " << t;
  if (!o.batch_sizes.empty()) {  // absent when default: the keys of the documented runs are unchanged
    s << " batch-sizes";
    for (int64_t b : o.batch_sizes) s << " " << b;
  }
  if (o.variation) s << " vary " << o.variation;  // absent at 0: the keys of the documented runs are unchanged
  if (o.draft) {
    GPT d = o.draft;
    s << " draft " << model_digest(d);
  }  // absent without one, as above
  if (o.spec_draws) s << " draws " << o.spec_draws;
  s << " past " << o.past_window << " (" << o.inside_window_why << ") tol " << o.tolerance.logits << "/" << o.tolerance.self << "/"
    << (o.tolerance.max_kl ? *o.tolerance.max_kl : -1.0) << "/" << (o.tolerance.min_top1 ? *o.tolerance.min_top1 : -1.0) << " device "
    << o.prompt.device().str();
  return s.str();
}

Reference build_reference(GPT& model, const EquivalenceOptions& opts) {
  validate(opts);
  return cached_reference(model, opts.prompt, opts.tokens);
}

std::vector<std::string> check_names() {
  std::vector<std::string> out;
  for (const auto* table : {&model_checks(), &sampler_checks()})
    for (const auto& c : *table) out.push_back(c.name);
  return out;
}

const CheckDef& find_check(const std::string& name) {
  for (const auto* table : {&model_checks(), &sampler_checks()})
    for (const auto& c : *table)
      if (c.name == name) return c;
  throw std::invalid_argument("unknown check '" + name + "' (known: " + model_check_list() + ", and the sampler/<law> rows of `tinygpt checks`)");
}

std::vector<std::string> model_checks_with(Tags all, Tags none) {
  std::vector<std::string> out;
  for (const auto& c : model_checks())
    if ((c.tags & all) == all && (c.tags & none) == 0) out.push_back(c.name);
  return out;
}

std::vector<std::string> row_operation_checks() {
  std::vector<std::string> out;
  for (const auto& c : model_checks())
    if (!c.ops.empty() && c.is(Tag::Serving) && !c.is(Tag::EngineOnly)) out.push_back(c.name);  // our model's rows
  return out;
}

std::string model_check_list() {
  std::string s;
  for (const auto& c : model_checks()) s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

namespace {

// The row's skip, when it has one here: an operation the target lacks, or a row that proves
// nothing while the run is kept inside the window.
bool skipped_here(const CheckDef& def, CheckContext& ctx, CheckResult& r) {
  if (def.is(Tag::OnlyPastWindow) && !ctx.opts.past_window) {
    r.status = Status::Skipped;
    r.detail = "skipped (" + ctx.opts.inside_window_why + "): the target is never driven past the context";
    return true;
  }
  if (!ctx.target.offers().takes(def.rows)) {
    r.status = Status::Skipped;
    r.detail = "skipped: the row drives " + std::to_string(def.rows) + " rows at once and the target takes at most " +
               std::to_string(*ctx.target.offers().max_rows) + " (its hello's max_rows)";
    return true;
  }
  // A target that takes whole requests only runs the rows of its whole-request operations: generate, and
  // speculate (whose plain greedy run is then the target's own, CheckContext::main).
  if (!def.is(Tag::Sampler) && !(def.ops == Ops{Op::Generate}) && !(def.ops == Ops{Op::Speculate}) &&
      !ctx.target.offers().takes_rows()) {
    r.status = Status::Skipped;
    r.detail = "skipped: " + ctx.target.offers().no_rows;
    return true;
  }
  std::string why;  // the first operation the target lacks, in the enum's order
  def.ops.each([&](Op op) {
    if (why.empty()) why = ctx.target.offers().why_not(op);
  });
  if (!why.empty()) {
    r.status = Status::Skipped;
    r.detail = "skipped: " + why;
    return true;
  }
  return false;
}

// Says in the row which declared deviations touch it: those that set its bound, and those that
// give it none (a failure of such a row is reported as declared, never as a silent pass).
void annotate_deviations(const CheckDef& def, const RowBound& b, CheckResult& row) {
  const bool judged = row.status != Status::Skipped;  // a row skipped here was judged by no bound
  for (const auto* names : {&b.relaxed_by, &b.declared_by})
    for (const auto& n : *names) row.bound += (row.bound.empty() ? "" : "; ") + std::string("declared ") + n;
  if (row.status == Status::Fail && !b.declared_by.empty()) {
    row.status = Status::Skipped;
    row.detail = "declared: " + b.declared_by.front() + ": " + row.detail;
  }
  if (!b.relaxed_by.empty() && judged) {
    const std::string names = join(b.relaxed_by);
    // What judged it: the self bound, a KL bound (--max-kl or a deviation's), or the relaxed |diff|.
    const std::string bound = def.judge == Judge::Self ? sci(b.tol.self)
                              : b.tol.by_distribution()  ? judge(StepDiffs{}, b.tol).bound
                                                         : sci(b.tol.logits);
    row.detail = "declared " + names + ", judged at " + bound + ": " + row.detail;
  }
}

}  // namespace

CheckResult run_check(const CheckDef& def, CheckContext& ctx) {
  CheckResult r;
  r.name = def.name;
  const auto t0 = std::chrono::steady_clock::now();
  ctx.row_ = &def;
  ctx.bound_ = ctx.bound_for(def);
  try {
    if (!skipped_here(def, ctx, r)) {
      def.run(ctx, r);
      // A row judged against our model says the bound that judged it (judge.h), whatever its run wrote.
      if (r.bound.empty() && def.judge == Judge::Reference) r.bound = judge(StepDiffs{}, ctx.tol()).bound;
    }
  } catch (const CheckFailure& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    r = CheckResult{};
    r.name = def.name;
    r.status = Status::Fail;
    r.detail = msg;
  } catch (const std::exception& e) {
    r = error_result(def.name, e.what());
  }
  annotate_deviations(def, ctx.bound_, r);
  ctx.row_ = nullptr;
  ctx.bound_ = RowBound{ctx.opts.tolerance, {}, {}};
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

EquivalenceResult run_checks(GPT& model, const EquivalenceOptions& opts, DecodeTarget& target,
                             const std::vector<std::string>& names, const Reference* shared) {
  validate(opts);
  const Config& cfg = model->config();
  EquivalenceResult r;
  r.cache = target.name();
  r.prompt_len = opts.prompt.size(1);
  r.tokens = opts.tokens;
  r.batch = opts.prompt.size(0);
  r.context = cfg.context;
  r.sequence_length = r.prompt_len + opts.tokens;
  r.must_match = std::max<int64_t>(0, std::min(cfg.context - r.prompt_len, opts.tokens));
  r.tolerance = opts.tolerance.logits;
  if (!opts.tolerance.why.empty()) r.tolerance_reason = opts.tolerance.why;
  at::NoGradGuard no_grad;
  CheckContext ctx(model, opts, target, r, shared);
  const std::vector<std::string> run = names.empty() ? model_checks_with(static_cast<Tags>(Tag::Default)) : names;
  std::vector<const CheckDef*> defs;
  for (const auto& n : run) defs.push_back(&find_check(n));
  for (const CheckDef* d : defs) r.checks.push_back(run_check(*d, ctx));
  // The uncached margins, for reports: computed only when a model check built the reference.
  if (shared || ctx.have_main()) {
    at::Tensor m = ctx.ref().uncached_margin.contiguous();
    r.step_margins.assign(m.data_ptr<double>(), m.data_ptr<double>() + m.numel());
  }
  return r;
}

EquivalenceOptions judged_as(const EquivalenceOptions& opts, const CacheVariant& variant) {
  EquivalenceOptions o = opts;
  if (variant.kv_budget && !o.tolerance.max_kl && !o.tolerance.min_top1) o.tolerance.max_kl = variant.kv_budget;
  return o;
}

EquivalenceResult check_equivalence(GPT& model, const EquivalenceOptions& opts, const Reference& ref,
                                    const CacheVariant& variant) {
  // One target (one cache object) for every check, as a server holds one: the production loop
  // starts each sequence itself (its schedule resets the cache), which the reset check verifies.
  ModelTarget target(model, variant);
  return run_checks(model, judged_as(opts, variant), target, {}, &ref);
}

std::string format_equivalence(const EquivalenceResult& r) {
  std::ostringstream s;
  if (r.produced.defined()) {
    if (r.identical_prefix >= r.must_match)
      s << "first " << r.must_match << " tokens identical with and without the cache\n";
    else
      s << "only the first " << r.identical_prefix << " of " << r.must_match
        << " in-window tokens identical with and without the cache: step " << r.identical_prefix
        << " differs inside the window\n";
    if (r.first_difference) {
      s << "first difference at position " << *r.first_difference << " of " << r.sequence_length;
      if (*r.first_difference >= r.context)
        s << " (past the " << r.context << "-token window: expected, the rolling cache keeps entries computed while "
          << "evicted tokens were visible; SPEC 4)";
      if (r.margin_at_difference) s << "; top-2 margin there " << sci(*r.margin_at_difference);
      const size_t step = static_cast<size_t>(r.identical_prefix);
      if (step < r.loop_full.diffs.size()) s << "; logit |diff| there " << sci(r.loop_full.diffs[step]);
      s << "\n";
    } else {
      s << "all " << r.sequence_length << " positions identical\n";
    }
  }
  for (const auto& c : r.checks) {
    const char* v = c.status == Status::Pass ? "PASS " : c.status == Status::Fail ? "FAIL " : c.status == Status::Error ? "ERROR " : "SKIP ";
    s << "  " << v << c.name << ": " << c.detail << "\n";
  }
  s << "tolerance " << sci(r.tolerance) << ": " << r.tolerance_reason << "\n";
  return s.str();
}

}  // namespace tinygpt::checks
