#include "tinygpt/checks/conform.h"

#include <ATen/ATen.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>

#include "engine_process.h"
#include "tinygpt/checks/deviations.h"
#include "remote_target.h"
#include "tinygpt/checkpoint.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/checks/export.h"
#include "tinygpt/safetensors.h"

namespace tinygpt::checks {

namespace {

using nlohmann::json;

bool selected(const std::vector<std::string>& groups, const std::string& g) {
  for (const auto& c : groups)
    if (c == "all" || c == g) return true;
  return false;
}

// A private folder for the weights in the engine's format, removed on every exit path.
struct TempDir {
  std::string path;
  TempDir() {
    path = (std::filesystem::temp_directory_path() / "tinygpt-conform-XXXXXX").string();
    if (!mkdtemp(path.data())) throw std::runtime_error("conform: cannot create a temporary folder");
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

std::vector<std::string> conform_selection(const std::vector<std::string>& groups) {
  for (const auto& g : groups) {
    if (g == "all" || g == "sampler") continue;
    bool known = false;
    for (const auto& c : model_checks()) known |= c.name == g;
    if (!known) {
      std::string names = "all, sampler";
      for (const auto& c : model_checks()) names += ", " + c.name;
      throw std::invalid_argument("--checks: unknown group '" + g + "' (known: " + names + ")");
    }
  }
  std::vector<std::string> out;
  for (const auto& c : model_checks())
    if (selected(groups, c.name)) out.push_back(c.name);
  if (selected(groups, "sampler"))  // an engine shows its sampler through draws only
    for (const auto& c : sampler_checks())
      if (!c.needs_scores) out.push_back(c.name);
  return out;
}

struct LoadedEngine::Impl {
  std::string checkpoint, name, format;
  Checkpoint ck;
  GPT model{nullptr};
  TempDir tmp;
  std::unique_ptr<EngineProcess> proc;
  json hello;
  int protocol = 1;
  std::vector<std::string> operations;
};

LoadedEngine::LoadedEngine(const std::string& command, const std::string& checkpoint, double timeout_s,
                           const std::function<void(const std::string&)>& progress)
    : impl_(std::make_unique<Impl>()) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  Impl& m = *impl_;
  m.checkpoint = checkpoint.empty() ? data_dir() + "/fixture.safetensors" : checkpoint;
  m.ck = read_any_checkpoint(m.checkpoint);
  m.model = model_from_checkpoint(m.ck, c10::Device(c10::kCPU), m.checkpoint);
  const Config& cfg = m.model->config();
  m.proc = std::make_unique<EngineProcess>(command, timeout_s);
  m.hello = m.proc->call({{"op", "hello"}, {"protocol", 2}});
  if (!m.hello["ok"].get<bool>()) throw EngineUnusable("engine: 'hello' answered ok false: " + m.hello["error"].get<std::string>());
  m.name = m.hello.value("name", std::string("(unnamed)"));
  m.protocol = m.hello.contains("protocol") && m.hello["protocol"].is_number_integer() ? m.hello["protocol"].get<int>() : 1;
  if (m.protocol >= 2 && m.hello.contains("operations") && m.hello["operations"].is_array())
    for (const auto& op : m.hello["operations"])
      if (op.is_string()) m.operations.push_back(op.get<std::string>());
  const auto& known = export_formats();
  if (m.hello.contains("formats") && m.hello["formats"].is_array())
    for (const auto& f : m.hello["formats"])
      if (f.is_string() && m.format.empty() && std::find(known.begin(), known.end(), f.get<std::string>()) != known.end())
        m.format = f.get<std::string>();
  if (m.format.empty())
    throw EngineUnusable("engine: 'hello' named no format we write (pt, safetensors, gguf, onnx): " + m.hello.dump());
  const std::string file = m.tmp.path + "/model." + m.format;
  say("writing the model as " + m.format);
  export_model(m.ck, m.model, m.format, file);
  const json config = {{"vocab_size", cfg.vocab_size}, {"d_model", cfg.d_model}, {"n_heads", cfg.n_heads},
                       {"n_layers", cfg.n_layers}, {"context", cfg.context}};
  json load = m.proc->call({{"op", "load"}, {"checkpoint", file}, {"format", m.format}, {"config", config}});
  if (!load["ok"].get<bool>()) throw EngineUnusable("engine: 'load' answered ok false: " + load["error"].get<std::string>());
  say("engine '" + m.name + "' loaded " + m.checkpoint + " as " + m.format);
}

LoadedEngine::~LoadedEngine() = default;
const std::string& LoadedEngine::name() const { return impl_->name; }
const std::string& LoadedEngine::format() const { return impl_->format; }
const std::string& LoadedEngine::checkpoint() const { return impl_->checkpoint; }
const nlohmann::json& LoadedEngine::hello() const { return impl_->hello; }
int LoadedEngine::protocol() const { return impl_->protocol; }
bool LoadedEngine::supports(const std::string& op) const {
  return std::find(impl_->operations.begin(), impl_->operations.end(), op) != impl_->operations.end();
}
GPT& LoadedEngine::model() { return impl_->model; }
EngineProcess& LoadedEngine::process() { return *impl_->proc; }
nlohmann::json LoadedEngine::call(const nlohmann::json& request) { return impl_->proc->call(request); }

ConformReport run_conform(const ConformOptions& o) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  ConformReport rep;
  rep.command = o.engine;
  const std::vector<std::string> names = conform_selection(o.groups);
  at::NoGradGuard no_grad;
  LoadedEngine engine(o.engine, o.checkpoint, o.timeout_s, o.progress);
  rep.checkpoint = engine.checkpoint();
  rep.engine_name = engine.name();
  rep.format = engine.format();
  GPT& model = engine.model();
  const Config& cfg = model->config();
  EngineProcess& proc = engine.process();
  const json& hello = engine.hello();

  RemoteTarget target(proc, hello, cfg.vocab_size, cfg.context);
  rep.protocol = engine.protocol();
  rep.deviations = target.deviations();
  EquivalenceOptions eo;
  eo.prompt = at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong).unsqueeze(0);
  const int64_t inside_steps = cfg.context - eo.prompt.size(1) + 1;
  eo.tokens = o.no_past_window ? std::min(o.tokens, inside_steps) : o.tokens;
  eo.past_window = !o.no_past_window;
  eo.tolerance = o.tolerance;
  eo.self_stride = o.self_stride;
  eo.require_batch_invariance = o.require_batch_invariance;
  // The batch check's rows: prompts 11 ids apart, as protocol-1 engines have always been checked.
  eo.batch_stride = 11;
  validate(eo);

  // Declared deviations: a row each, saying what it relaxes; the rows they touch are judged by the
  // deviation's bound and say so.
  std::vector<const Deviation*> declared;
  for (const auto& name : rep.deviations) {
    CheckResult row;
    row.name = "declared: " + name;
    row.status = Status::Skipped;
    if (const Deviation* d = find_deviation(name)) {
      declared.push_back(d);
      std::string touched;
      for (const auto& c : d->checks) touched += (touched.empty() ? "" : ", ") + c;
      row.detail = d->what + "; " + (d->tolerance ? "judges " + touched + " at max |diff| <= " + sci(*d->tolerance)
                                                  : "reports " + touched + " as declared where it fails") +
                   (d->self_tolerance ? ", self at " + sci(*d->self_tolerance) : std::string()) + " (" + d->evidence + ")";
    } else {
      row.detail = "unknown to this suite: no check relaxed (known: gelu-tanh, rope-angle-recurrence, top-k-exact)";
    }
    rep.rows.push_back(row);
  }
  auto touching = [&](const std::string& check) {
    std::vector<const Deviation*> out;
    for (const Deviation* d : declared)
      if (std::find(d->checks.begin(), d->checks.end(), check) != d->checks.end()) out.push_back(d);
    return out;
  };
  const double logits_tolerance = eo.tolerance.logits, self_tolerance = eo.tolerance.self;

  EquivalenceResult& r = rep.model;
  r = EquivalenceResult{};
  r.cache = target.name();
  r.prompt_len = eo.prompt.size(1);
  r.tokens = eo.tokens;
  r.batch = 1;
  r.context = cfg.context;
  r.sequence_length = r.prompt_len + eo.tokens;
  r.must_match = std::max<int64_t>(0, std::min(cfg.context - r.prompt_len, eo.tokens));
  r.tolerance = eo.tolerance.logits;
  CheckContext ctx(model, eo, target, r);
  bool said_no_sampler = false;
  for (const auto& name : names) {
    // An engine without a sampler gets one row saying so, not one per sampler check.
    if (!target.sampler() && name.rfind("sampler/", 0) == 0) {
      if (!said_no_sampler) {
        CheckResult row;
        row.name = "sampler";
        row.status = Status::Skipped;
        row.detail = "skipped: the engine has no sampler (its hello says \"sampler\": false)";
        rep.rows.push_back(row);
        said_no_sampler = true;
      }
      continue;
    }
    const CheckDef& def = find_check(name);
    if (rep.fatal) {
      rep.rows.push_back(error_result(name, "not run: the engine could not be run"));
      continue;
    }
    say(name + " ...");
    const auto devs = touching(name);
    eo.tolerance.logits = logits_tolerance;
    eo.tolerance.self = self_tolerance;
    for (const Deviation* d : devs) {
      if (d->tolerance) eo.tolerance.logits = std::max(eo.tolerance.logits, *d->tolerance);
      if (d->self_tolerance) eo.tolerance.self = std::max(eo.tolerance.self, *d->self_tolerance);
    }
    const double bound = name == "self" ? eo.tolerance.self : eo.tolerance.logits;
    CheckResult row = run_check(def, ctx);
    if (target.unusable()) rep.fatal = *target.unusable();
    std::string relaxing;  // the declared deviations that set this row's bound
    for (const Deviation* d : devs) {
      row.bound += (row.bound.empty() ? "" : "; ") + std::string("declared ") + d->name;
      const bool relaxes = name == "self" ? d->self_tolerance.has_value() : d->tolerance.has_value();
      if (relaxes) {
        relaxing += (relaxing.empty() ? "" : ", ") + d->name;
      } else if (row.status == Status::Fail) {
        row.status = Status::Skipped;
        row.detail = "declared: " + d->name + ": " + row.detail;
      }
    }
    if (!relaxing.empty()) row.detail = "declared " + relaxing + ", judged at " + sci(bound) + ": " + row.detail;
    if (!row.ok() && !rep.fatal) say("FAIL " + name + ": " + row.detail);
    rep.rows.push_back(row);
  }
  eo.tolerance.logits = logits_tolerance;
  eo.tolerance.self = self_tolerance;
  r.checks = rep.rows;
  if (!rep.fatal && !proc.quit()) {
    CheckResult q;
    q.name = "quit";
    q.status = Status::Fail;
    q.detail = "the engine did not exit 0 after 'quit'";
    rep.rows.push_back(q);
  }
  rep.requests = proc.requests();
  return rep;
}

}  // namespace tinygpt::checks
