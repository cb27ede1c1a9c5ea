// The sampler rows of the check table: every law of the property suite (RapidCheck generating
// logits, histories and settings) and every fixed check, through the target's sampler. A target
// seen only through its draws (an engine's `sample`) runs the laws that need nothing else; one that
// shows its filtered scores (our sampler, a kit user's) runs them all.
#include <ATen/ATen.h>
#include <rapidcheck.h>

#include <iostream>
#include <mutex>
#include <sstream>

#include "tinygpt/checks/check_suite.h"
#include "tinygpt/laws/sampler_laws.h"

namespace tinygpt::checks {

namespace {

// Runs one RapidCheck property as rc::check does, with its report kept: the verdict line and the
// failed assertion go in the row, the whole report (with RapidCheck's reproduce string) to stderr.
bool run_property(const std::string& name, const std::function<void()>& body, std::string& detail) {
  // RapidCheck's configuration and report printing are process-wide.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  rc::detail::configuration();
  rc::detail::TestMetadata metadata;
  metadata.id = name;
  metadata.description = name;
  const auto result = rc::detail::checkTestable(body, metadata);
  std::ostringstream report;
  rc::detail::printResultMessage(result, report);
  std::istringstream lines(report.str());
  std::string line, why, assertion;
  while (std::getline(lines, line)) {
    if (why.empty() && !line.empty()) why = line;
    if (assertion.empty() && (line.rfind("RC_ASSERT", 0) == 0 || line.find("answered") != std::string::npos ||
                              line.find("exception") != std::string::npos))
      assertion = line;
  }
  detail = why + (assertion.empty() ? "" : "; " + assertion);
  const bool ok = result.template is<rc::detail::SuccessResult>();
  if (!ok) std::cerr << "\n- " << name << "\n" << report.str() << "\n";
  return ok;
}

const props::SamplerUnderTest* sampler_or_skip(CheckContext& c, CheckResult& r) {
  if (const std::string& why = c.target.offers().no_sampler; !why.empty()) {
    r.status = Status::Skipped;
    r.detail = "skipped: " + why;
    return nullptr;
  }
  return &c.target.sampler();
}

// A row per law: its name after the law, judged by its formula. A law that reads filtered scores is
// skipped on a target that shows only its draws.
CheckDef law_row(const props::Law& law) {
  CheckDef def;
  def.name = check::kSamplerPrefix + law.name;
  def.proves = law.formula;
  def.tags = law.pick_only ? static_cast<Tags>(Tag::Sampler) : Tag::Sampler | Tag::NeedsScores;
  def.judge = Judge::Law;
  def.cost = Cost::Law;
  def.catches = "a sampler that breaks the law (RapidCheck shrinks it to a small counterexample)";
  def.run = [law](CheckContext& c, CheckResult& r) {
    const props::SamplerUnderTest* s = sampler_or_skip(c, r);
    if (!s) return;
    if (!law.pick_only && !s->filtered) {
      r.status = Status::Skipped;
      r.detail = "skipped: the law reads filtered scores, and the target shows only its draws";
      return;
    }
    if (law.rows && !s->pick_rows) {
      r.status = Status::Skipped;
      r.detail = "skipped: the target samples a batch with one setting and one seed (an engine: its hello lists no row-sampling)";
      return;
    }
    r.bound = law.formula;
    const c10::Device dev = c.opts.prompt.defined() ? c.opts.prompt.device() : c10::Device(c10::kCPU);
    r.status = run_property(law.name, [&] { law.body(*s, dev); }, r.detail) ? Status::Pass : Status::Fail;
  };
  return def;
}

// A row per fixed check: the seed's examples, SPEC 6's tie rules, each stage's direction, the
// chi-square test; each through draws only.
CheckDef fixed_row(const props::FixedCheck& check) {
  CheckDef def;
  def.name = check::kSamplerPrefix + check.name;
  def.proves = check.formula;
  def.tags = static_cast<Tags>(Tag::Sampler);
  def.judge = Judge::Law;
  def.cost = Cost::Law;
  def.catches = "a sampler that breaks this fixed case of SPEC 6";
  def.run = [check](CheckContext& c, CheckResult& r) {
    const props::SamplerUnderTest* s = sampler_or_skip(c, r);
    if (!s) return;
    r.bound = check.formula;
    const c10::Device dev = c.opts.prompt.defined() ? c.opts.prompt.device() : c10::Device(c10::kCPU);
    const std::string why = check.run(*s, dev);
    r.status = why.empty() ? Status::Pass : Status::Fail;
    r.detail = why.empty() ? check.formula : why;
  };
  return def;
}

std::vector<CheckDef> make_table() {
  std::vector<CheckDef> table;
  for (const auto& law : props::generated_laws()) table.push_back(law_row(law));
  for (const auto& check : props::fixed_checks()) table.push_back(fixed_row(check));
  return table;
}

}  // namespace

const std::vector<CheckDef>& sampler_checks() {
  static const std::vector<CheckDef> table = make_table();
  return table;
}

}  // namespace tinygpt::checks
