#include "tinygpt/checks/check_suite.h"

#include <ATen/ATen.h>

#include <chrono>
#include <sstream>
#include <stdexcept>

namespace tinygpt::checks {

const CheckResult* EquivalenceResult::check(const std::string& name) const {
  for (const auto& c : checks)
    if (c.name == name) return &c;
  return nullptr;
}

CheckContext::CheckContext(GPT& m, const EquivalenceOptions& o, DecodeTarget& t, EquivalenceResult& r, const Reference* shared)
    : model(m), opts(o), target(t), out(r), shared_(shared) {}

const Reference& CheckContext::ref() {
  if (shared_) return *shared_;
  if (!own_ref_) own_ref_ = build_reference(model, opts.prompt, opts.tokens);
  return *own_ref_;
}

const Generation& CheckContext::main(const std::string& asking_check) {
  if (main_) return *main_;
  if (main_error_) throw std::runtime_error("the target's main run did not complete (see " + *main_error_ + ")");
  main_error_ = asking_check;  // if the run throws, later checks point here
  main_ = target.generate(opts.prompt, opts.tokens, greedy());
  main_error_.reset();
  return *main_;
}

const StepReference& CheckContext::main_reference() {
  if (!main_ref_) {
    const Generation& m = main("logits");
    const Reference& r = ref();
    main_ref_ = m.seq.to(r.uncached.device()).equal(r.uncached)
                    ? r.steps
                    : reference_for(model, m.seq.to(r.uncached.device()), opts.prompt.size(1), opts.tokens);
  }
  return *main_ref_;
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
  if (opts.self_stride < 1) throw std::invalid_argument("equivalence: self stride must be >= 1");
  if (t.max_kl && !(*t.max_kl > 0)) throw std::invalid_argument("--max-kl must be > 0");
  if (t.min_top1 && !(*t.min_top1 > 0 && *t.min_top1 <= 1)) throw std::invalid_argument("--min-top1 must be in (0, 1]");
}

Reference build_reference(GPT& model, const EquivalenceOptions& opts) {
  validate(opts);
  return build_reference(model, opts.prompt, opts.tokens);
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
  std::string known;
  for (const auto& n : check_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown check '" + name + "' (known: " + known + ")");
}

CheckResult run_check(const CheckDef& def, CheckContext& ctx) {
  CheckResult r;
  r.name = def.name;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    def.run(ctx, r);
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
  at::NoGradGuard no_grad;
  CheckContext ctx(model, opts, target, r, shared);
  std::vector<const CheckDef*> defs;
  if (names.empty()) {
    for (const auto& c : model_checks())
      if (c.in_default) defs.push_back(&c);
  } else {
    for (const auto& n : names) defs.push_back(&find_check(n));
  }
  for (const CheckDef* d : defs) r.checks.push_back(run_check(*d, ctx));
  // The uncached margins, for reports: computed only when a model check built the reference.
  if (shared || ctx.have_main()) {
    at::Tensor m = ctx.ref().uncached_margin.contiguous();
    r.step_margins.assign(m.data_ptr<double>(), m.data_ptr<double>() + m.numel());
  }
  return r;
}

EquivalenceResult check_equivalence(GPT& model, const EquivalenceOptions& opts, const Reference& ref,
                                    const CacheVariant& variant) {
  // One target (one cache object) for every check, as a server holds one: the production loop
  // starts each sequence itself (its schedule resets the cache), which the reset check verifies.
  ModelTarget target(model, variant);
  return run_checks(model, opts, target, {}, &ref);
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
  s << "tolerance " << sci(r.tolerance) << ": " << kLogitToleranceReason << "\n";
  return s.str();
}

}  // namespace tinygpt::checks
