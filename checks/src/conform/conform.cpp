#include "tinygpt/checks/conform.h"

#include <ATen/ATen.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "engine_process.h"
#include "mirror_target.h"
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

// The row of one declared deviation: what it relaxes (derived from the check table), or that this
// suite does not know it.
CheckResult declared_row(const std::string& name) {
  CheckResult row;
  row.name = "declared: " + engine_text(name, 80);
  row.status = Status::Skipped;
  const Deviation* d = find_deviation(name);
  if (!d) {
    row.detail = "unknown to this suite: no check relaxed (known: " + deviation_names() + ")";
    return row;
  }
  std::string touched;
  for (const auto& c : d->touched())
    if (std::find(d->voids.begin(), d->voids.end(), c) == d->voids.end()) touched += (touched.empty() ? "" : ", ") + c;
  const std::string voided = join(d->voids);
  if (d->inside_window) {
    row.detail = d->what + "; keeps the run inside the window, as --no-past-window does: " + touched +
                 " skipped, saying so, the other rows stopped at the window's edge (" + d->evidence + ")";
    return row;
  }
  row.detail = d->what + "; " +
               (d->max_kl      ? "judges " + touched + " by mean KL per step <= " + sci(*d->max_kl)
                : d->tolerance ? "judges " + touched + " at max |diff| <= " + sci(*d->tolerance)
                               : "reports " + touched + " as declared where it fails") +
               (d->self_tolerance ? ", self at " + sci(*d->self_tolerance) : std::string()) +
               (voided.empty() ? std::string() : "; reports " + voided + " as declared where it fails") + " (" + d->evidence + ")";
  return row;
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

std::vector<std::string> conform_selection(const std::vector<std::string>& groups, bool deep) {
  for (const auto& g : groups) {
    if (g == "all" || g == "sampler") continue;
    bool known = false;
    for (const auto& c : model_checks()) known |= c.name == g;
    if (!known) throw std::invalid_argument("--checks: unknown group '" + g + "' (known: all, sampler, " + model_check_list() + ")");
  }
  std::vector<std::string> out;
  for (const auto& c : model_checks())  // a row of statistical power only with --deep or by name
    if (selected(groups, c.name) && (deep || !c.is(Tag::Deep) || std::count(groups.begin(), groups.end(), c.name)))
      out.push_back(c.name);
  if (selected(groups, "sampler"))  // an engine shows its sampler through draws only
    for (const auto& c : sampler_checks())
      if (!c.is(Tag::NeedsScores)) out.push_back(c.name);
  return out;
}

namespace {
std::vector<std::string> hello_list(const nlohmann::json& hello, const char* key) {
  std::vector<std::string> listed;
  if (hello.contains(key) && hello[key].is_array())
    for (const auto& t : hello[key])
      if (t.is_string()) listed.push_back(t.get<std::string>());
  return listed;
}
}  // namespace

double default_weight_budget(const std::string& weight_type) {
  if (weight_type.empty() || weight_type == "f32") return 0.0;
  return weight_type.rfind("q8", 0) == 0 || weight_type == "f16" || weight_type == "bf16" ? 1e-3 : 5e-2;
}

std::vector<std::string> hello_kv_types(const nlohmann::json& hello) { return hello_list(hello, "kv_types"); }
std::vector<std::string> hello_weight_types(const nlohmann::json& hello) { return hello_list(hello, "weight_types"); }

namespace {
// `part` of the value `flag` asked for must be one of what hello lists under `key` (a `what` of the
// engine's): std::invalid_argument naming the list otherwise.
void require_listed(const json& hello, const char* key, const std::string& flag, const std::string& value, const std::string& part,
                    const std::string& what) {
  const std::vector<std::string> listed = hello_list(hello, key);
  if (std::find(listed.begin(), listed.end(), part) == listed.end())
    throw std::invalid_argument(flag + " " + value + ": the engine has no " + what + " '" + part + "' (its hello's " + key + ": " +
                                (listed.empty() ? std::string("none") : engine_json(hello[key])) + ")");
}

// A zoo member (SPEC 10) goes as a Hugging Face directory, a GGUF file or an ONNX graph, which carry its
// knobs (the GGUF's architecture is the llama.cpp graph that computes it; the ONNX graph is written
// from its config); the series' formats would drop them. A model of the seed's architecture goes in any
// format we write except a Hugging Face directory, which cannot carry its RoPE's adjacent pairs.
// Either goes in the first such format hello lists; "" when none.
std::string format_for(const json& hello, const Config& cfg) {
  static const std::vector<std::string> zoo_formats = {"hf", "gguf", "onnx", "transformers-js"};
  const auto& known = export_formats();
  const bool zoo = !cfg.is_seed_architecture();
  if (hello.contains("formats") && hello["formats"].is_array())
    for (const auto& e : hello["formats"]) {
      if (!e.is_string() || std::find(known.begin(), known.end(), e.get<std::string>()) == known.end()) continue;
      const std::string f = e.get<std::string>();
      if (zoo ? std::count(zoo_formats.begin(), zoo_formats.end(), f) > 0 : f != "hf") return f;
    }
  return "";
}
}  // namespace

struct LoadedEngine::Impl {
  std::string checkpoint, name, format;
  Checkpoint ck;
  GPT model{nullptr};
  TempDir tmp;
  std::unique_ptr<EngineProcess> proc;
  json hello, load_request;
  std::string file;  // the model in the engine's format
  int protocol = 1;
  std::vector<std::string> operations;
};

LoadedEngine::LoadedEngine(const std::string& command, const std::string& checkpoint, double timeout_s,
                           const std::function<void(const std::string&)>& progress, const EnginePrecision& precision)
    : impl_(std::make_unique<Impl>()) {
  const std::string& kv_type = precision.kv_type;
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  Impl& m = *impl_;
  m.checkpoint = checkpoint.empty() ? data_dir() + "/fixture.safetensors" : checkpoint;
  m.ck = read_any_checkpoint(m.checkpoint);
  m.model = model_from_checkpoint(m.ck, c10::Device(c10::kCPU), m.checkpoint);
  const Config& cfg = m.model->config();
  m.proc = std::make_unique<EngineProcess>(command, timeout_s);
  m.hello = m.proc->call({{"op", "hello"}, {"protocol", kProtocol}});
  if (!m.hello["ok"].get<bool>()) throw EngineUnusable("engine: 'hello' answered ok false: " + engine_text(m.hello["error"].get<std::string>()));
  check_hello(m.hello);
  m.name = engine_text(m.hello.value("name", std::string("(unnamed)")), 80);
  m.protocol = m.hello.contains("protocol") ? m.hello["protocol"].get<int>() : 1;
  if (m.protocol >= 2 && m.hello.contains("operations"))
    for (const auto& op : m.hello["operations"])
      if (op.is_string()) m.operations.push_back(op.get<std::string>());
  const bool zoo = !cfg.is_seed_architecture();
  m.format = format_for(m.hello, cfg);
  if (m.format.empty() && zoo) {
    throw std::invalid_argument("conform: the model sets " + cfg.zoo_knob() + " (a zoo member, SPEC 10), which goes to an engine as a "
                                "Hugging Face directory, a GGUF file or an ONNX graph; this engine's hello lists none of \"hf\", "
                                "\"gguf\", \"onnx\", \"transformers-js\" (" + engine_json(m.hello["formats"]) + ")");
  }
  if (m.format.empty())
    throw EngineUnusable("engine: 'hello' named no format we write (pt, safetensors, gguf, onnx, hf): " + engine_json(m.hello));
  const std::string file = m.tmp.path + "/model." + m.format;
  say("writing the model as " + m.format);
  export_model(m.ck, m.model, m.format, file);
  const json config = {{"vocab_size", cfg.vocab_size}, {"d_model", cfg.d_model}, {"n_heads", cfg.n_heads},
                       {"n_layers", cfg.n_layers}, {"context", cfg.context},
                       {"n_kv_heads", cfg.kv_heads()}, {"head_dim", cfg.head_dim()}};  // the cache's shape
  json request = {{"op", "load"}, {"checkpoint", file}, {"format", m.format}, {"config", config}};
  if (!kv_type.empty()) {
    // Each of K and V ("K/V") must be a type the engine lists.
    const auto slash = kv_type.find('/');
    for (const std::string& part : {kv_type.substr(0, slash), slash == std::string::npos ? kv_type : kv_type.substr(slash + 1)})
      require_listed(m.hello, "kv_types", "--kv-type", kv_type, part, "KV cache type");
    request["kv_type"] = kv_type;
  }
  if (const std::string& w = precision.weight_type; !w.empty()) {
    require_listed(m.hello, "weight_types", "--weight-type", w, w, "weight type");
    request["weight_type"] = w;
  }
  m.file = file;
  m.load_request = request;
  json load = m.proc->call(request);
  if (!load["ok"].get<bool>()) throw EngineUnusable("engine: 'load' answered ok false: " + engine_text(load["error"].get<std::string>()));
  // An engine whose differences depend on the model (llama.cpp's GELU is in its gptneox and gemma2
  // graphs, not in llama's) names them once it has loaded it: they replace hello's.
  if (load.contains("deviations")) {
    if (!load["deviations"].is_array()) throw EngineUnusable("engine: 'load' answered deviations that are not a list: " + engine_json(load));
    m.hello["deviations"] = load["deviations"];
    check_hello(m.hello);
  }
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
std::string LoadedEngine::write_model(const Checkpoint& ck, GPT& model, const std::string& stem) {
  const std::string format = format_for(impl_->hello, model->config());
  if (format.empty())
    throw std::logic_error("conform: the engine lists no format that carries " + stem + "'s architecture (" +
                           engine_json(impl_->hello.value("formats", json::array())) + ")");
  const std::string file = impl_->tmp.path + "/" + stem + "." + format;
  export_model(ck, model, format, file);
  return file;
}
EngineProcess& LoadedEngine::process() { return *impl_->proc; }
const nlohmann::json& LoadedEngine::load_request() const { return impl_->load_request; }
const std::string& LoadedEngine::model_file() const { return impl_->file; }
nlohmann::json LoadedEngine::call(const nlohmann::json& request) { return impl_->proc->call(request); }

namespace {

bool low_kv(const ConformOptions& o) { return !o.kv_type.empty() && o.kv_type != "f32"; }
bool low_weights(const ConformOptions& o) { return !o.weight_type.empty() && o.weight_type != "f32"; }

// The self bound under quantized weights: about 3x the widest kernel noise measured there.
constexpr double kQuantizedSelfTolerance = 0.2;

// The mean-KL budget a low-precision engine's rows are judged by: the cache's, the weights', or both
// (their costs add); none at full precision.
std::optional<double> precision_budget(const ConformOptions& o) {
  if (!low_kv(o) && !low_weights(o)) return std::nullopt;
  return (low_kv(o) ? o.kv_budget : 0.0) + (low_weights(o) ? o.weights_budget() : 0.0);
}

// The options every row of a conform run reads: the main prompt, the tokens the engine may be
// driven (inside the window only with --no-past-window, or when the engine declares a deviation
// that keeps it there: `inside_by`), the bounds.
EquivalenceOptions conform_run_options(const ConformOptions& o, const Config& cfg, const Deviation* inside_by) {
  EquivalenceOptions eo;
  eo.prompt = main_prompt();
  const int64_t inside_steps = cfg.context - eo.prompt.size(1) + 1;
  const bool inside = o.no_past_window || inside_by;
  eo.tokens = inside ? std::min(o.tokens, inside_steps) : o.tokens;
  eo.past_window = !inside;
  if (inside_by && !o.no_past_window) eo.inside_window_why = "declared " + inside_by->name;
  eo.tolerance = o.tolerance;
  if (eo.tolerance.logits != kLogitTolerance && eo.tolerance.why.empty()) eo.tolerance.why = "--tolerance";
  // A low-precision KV type is judged against our model by its budget, as verify judges its own (a
  // cache's budget: judged_as), unless the user set a bound of the distribution themselves: the rows
  // would fail an fp32 |diff| bound that the type is not meant to meet.
  if (!o.tolerance.by_distribution())
    if (const std::optional<double> budget = precision_budget(o)) {
      eo.tolerance.max_kl = budget;
      eo.tolerance.min_top1 = o.kv_min_top1;
    }
  // Quantized weights: an engine's batched and single-token kernels need not round alike (llama.cpp
  // on the fixture: its cached steps part from its own prefill by 4.9e-2 at q8_0, 3.6e-2 at q4_0,
  // 7.0e-2 at q4_K_M, against 2.0e-4 with f32 weights), so self judges gross cache errors there, at a
  // bound the user may set (docs/checks.md, "Quantized weights"); a cache's finer errors are judged with
  // f32 weights.
  if (low_weights(o) && o.tolerance.self == kLogitTolerance) eo.tolerance.self = kQuantizedSelfTolerance;
  eo.self_stride = o.self_stride;
  eo.variation = o.variation;
  eo.require_batch_invariance = o.require_batch_invariance;
  eo.batch_sizes = o.batch_sizes;
  eo.require_thread_invariance = o.require_thread_invariance;
  // The batch check's rows: prompts this many ids apart (the stride engines have been checked with).
  constexpr int64_t kEngineBatchStride = 11;
  eo.batch_stride = kEngineBatchStride;
  validate(eo);
  return eo;
}

// The figures of the model rows, for plots: one greedy run from the main prompt.
EquivalenceResult conform_figures(const EquivalenceOptions& eo, const Config& cfg, const std::string& target) {
  EquivalenceResult r;
  r.cache = target;
  r.prompt_len = eo.prompt.size(1);
  r.tokens = eo.tokens;
  r.batch = 1;
  r.context = cfg.context;
  r.sequence_length = r.prompt_len + eo.tokens;
  r.must_match = std::max<int64_t>(0, std::min(cfg.context - r.prompt_len, eo.tokens));
  r.tolerance = eo.tolerance.logits;
  if (!eo.tolerance.why.empty()) r.tolerance_reason = eo.tolerance.why;
  return r;
}

// What a mirrored run's baseline is (the same engine at f32: its cache, its weights or both), as the
// rows' statistics key it ("f32_cache", "f32_weights", "f32_engine"), in words, and the budget it judges.
struct MirrorLabels {
  std::string key, words, budget;
  MirrorLabels(bool cache, bool weights)
      : key(cache && weights ? "f32_engine" : cache ? "f32_cache" : "f32_weights"),
        words(cache && weights ? "f32 weights and cache" : cache ? "an f32 cache" : "f32 weights"),
        budget(cache && weights ? "budget" : cache ? "KV budget" : "weights' budget") {}
};

// Runs the selected rows on the engine in table order. An engine without a sampler gets one row
// saying so, not one per sampler row; once the engine cannot be talked to, the rest are errors.
// With a mirror (a low-precision engine beside the same engine at f32), each row's answers are also
// judged against the mirror's by `kv_bounds`, its statistics and words as `labels` say.
// A failing row's requests: its own, or where it sent none (it judged the main run an earlier row
// sent), that row's.
struct RowRequests {
  std::string row, sender;
  Transcript t;
  std::string before_sender;  // the row that sent the main run, where this row sent requests after it
  Transcript before;          // its requests: the engine's state when this row began may need them
};

// With `transcripts`, each failing row's requests are kept there.
void run_rows(const std::vector<std::string>& names, CheckContext& ctx, RemoteTarget& target, ConformReport& rep,
              const std::function<void(const std::string&)>& say, MirrorTarget* mirror = nullptr,
              const Tolerances& kv_bounds = Tolerances{}, const MirrorLabels& labels = MirrorLabels(true, false),
              std::vector<RowRequests>* transcripts = nullptr) {
  bool said_no_sampler = false;
  Transcript main_run;  // the first requests a row sent: the main run, which later rows judge too
  std::string main_sender;
  for (const auto& name : names) {
    const CheckDef& def = find_check(name);
    if (!target.offers().no_sampler.empty() && def.is(Tag::Sampler)) {
      if (!said_no_sampler) {
        CheckResult row;
        row.name = "sampler";
        row.status = Status::Skipped;
        row.detail = "skipped: " + target.offers().no_sampler;
        rep.rows.push_back(row);
        said_no_sampler = true;
      }
      continue;
    }
    if (rep.fatal) {
      rep.rows.push_back(error_result(name, "not run: the engine could not be run"));
      continue;
    }
    say(name + " ...");
    const int64_t before = target.requests();
    Transcript transcript;
    if (transcripts) target.record(&transcript);
    CheckResult row = run_check(def, ctx);
    target.record(nullptr);
    row.stats["requests"] = static_cast<double>(target.requests() - before);  // the row's cost on the engine
    if (mirror) {  // a low-precision KV type: this row's answers against the same engine with an f32 cache
      const StepDiffs d = mirror->take();
      if (!d.kl.empty()) {
        const std::string& vs = labels.key;
        row.stats["kl_mean_vs_" + vs] = d.kl_mean();
        row.stats["kl_p99_vs_" + vs] = kl_p99(d);
        row.stats["kl_max_vs_" + vs] = d.kl_max();
        row.stats["top1_vs_" + vs] = d.top1_agreement();
        row.stats["worst_diff_vs_" + vs] = *std::max_element(d.diffs.begin(), d.diffs.end());
        const Verdict v = judge(d, kv_bounds);  // the KV budget, judged as every bound is
        if (!v.ok && row.status == Status::Pass) {
          const size_t first = v.first_over.value_or(d.kl.size() - 1);
          row.status = Status::Fail;
          row.detail = "against the same engine with " + labels.words + ", per answer: " + v.why + " - over the " + labels.budget + " (" + v.bound +
                       "; first answer over it: " + std::to_string(first + 1) + " of " + std::to_string(d.kl.size()) + ", KL " +
                       sci(d.kl[first]) + "); " + row.detail;
        }
      }
    }
    if (target.unusable()) {
      // The engine stopped answering during this row (inside a sampler law RapidCheck would report the
      // exception as a falsified property): the row is an error saying why, never a failure.
      rep.fatal = *target.unusable();
      if (row.status == Status::Fail) row.status = Status::Error, row.detail = *target.unusable();
    }
    if (!row.ok() && !rep.fatal) say("FAIL " + name + ": " + row.detail);
    if (transcripts && main_sender.empty() && !transcript.exchanges.empty()) main_run = transcript, main_sender = name;
    if (transcripts && !row.ok() && row.status != Status::Skipped) {
      if (transcript.exchanges.empty() && !main_sender.empty()) transcripts->push_back({name, main_sender, main_run, "", {}});
      else if (main_sender.empty() || main_sender == name) transcripts->push_back({name, name, std::move(transcript), "", {}});
      else transcripts->push_back({name, name, std::move(transcript), main_sender, main_run});
    }
    rep.rows.push_back(row);
  }
}

}  // namespace

namespace {

// A second instance of the engine for save-restore's fresh context: the same command started again,
// greeted and loaded the same way, at `precision`.
std::function<std::unique_ptr<DecodeTarget>()> second_instances(const ConformOptions& o, const Config& cfg, EnginePrecision precision) {
  return [&o, &cfg, precision]() -> std::unique_ptr<DecodeTarget> {
    auto second = std::make_shared<LoadedEngine>(o.engine, o.checkpoint, o.timeout_s, nullptr, precision);
    auto t = std::make_unique<RemoteTarget>(second->process(), second->hello(), cfg.vocab_size, cfg.context);
    t->own(second);
    return t;
  };
}

// A fresh engine for a reproduction: the same command started, greeted and loaded again.
class LoadedReplay final : public ReplayEngine {
 public:
  explicit LoadedReplay(std::unique_ptr<LoadedEngine> e) : e_(std::move(e)) {}
  nlohmann::json call(const nlohmann::json& request) override { return e_->call(request); }

 private:
  std::unique_ptr<LoadedEngine> e_;
};

// --repro's folder: created, and refused when it holds anything already (a bundle is never mixed
// with another run's); its other conditions, before the engine starts.
void check_repro(const ConformOptions& o) {
  if (o.repro_dir.empty()) return;
  if (low_kv(o) || low_weights(o))
    throw std::invalid_argument("--repro replays answers against our model at full precision: not with --kv-type or --weight-type");
  if (o.tolerance.by_distribution()) throw std::invalid_argument("--repro judges each answer by max |diff|: not with --max-kl or --min-top1");
  if (!(o.repro_budget_s > 0)) throw std::invalid_argument("--repro-budget must be > 0 seconds");
  for (const std::string& op : o.repro_keep)
    if (!std::count(replayed_operations().begin(), replayed_operations().end(), op))
      throw std::invalid_argument("--repro-keep: '" + op + "' is not an operation a reproduction replays (" + join(replayed_operations()) + ")");
  std::error_code ec;
  const std::filesystem::path dir(o.repro_dir);
  if (std::filesystem::exists(dir, ec)) {
    if (!std::filesystem::is_directory(dir, ec)) throw std::invalid_argument("--repro " + o.repro_dir + ": not a folder");
    if (!std::filesystem::is_empty(dir, ec)) throw std::invalid_argument("--repro " + o.repro_dir + ": the folder is not empty");
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::invalid_argument("--repro " + o.repro_dir + ": cannot create the folder (" + ec.message() + ")");
}

// Each failing row's transcript shrunk and written as a bundle (repro.h), judged at the rows' bound.
std::vector<ReproResult> reproduce_rows(const ConformOptions& o, const std::vector<RowRequests>& transcripts,
                                        LoadedEngine& engine, const ConformReport& rep, const EquivalenceOptions& eo,
                                        const std::function<void(const std::string&)>& say) {
  ReproSetup s;
  s.engine = o.engine;
  s.protocol = engine.protocol();
  s.hello = engine.hello();
  s.load = engine.load_request();
  s.model_file = engine.model_file();
  s.budget_s = o.repro_budget_s;
  s.keep_ops = o.repro_keep;
  s.diagnose = o.diagnose;
  s.out_dir = o.repro_dir;
  // The row's bound: the run's, or a declared deviation's that touches the row (judged as the row was).
  // A bundle compares logits with the reference's: a row that judged tokens or the engine against
  // itself takes the bound of the deviations that touch a row judged against the reference.
  auto touches = [](const Deviation& d, const CheckDef& row) {
    if (d.touches(row)) return true;
    if (row.judge != Judge::Tokens && row.judge != Judge::Repeat) return false;
    const auto& all = model_checks();
    return std::any_of(all.begin(), all.end(), [&](const CheckDef& c) { return c.judge == Judge::Reference && d.touches(c); });
  };
  auto bound_of = [&](const std::string& row, std::string& by_kl) {
    s.bound = eo.tolerance.logits;
    s.bound_why = eo.tolerance.why.empty() ? "the default bound: float32 noise between two correct implementations" : eo.tolerance.why;
    by_kl.clear();
    for (const std::string& name : rep.deviations)
      if (const Deviation* d = find_deviation(name); d && touches(*d, find_check(row))) {
        if (d->max_kl) by_kl = name;
        else if (d->tolerance && *d->tolerance > s.bound) s.bound = *d->tolerance, s.bound_why = "the bound of the declared deviation " + name;
      }
  };
  // The checkpoint as a source checkout names it where it is one of ours (golden/zoo/NAME/...).
  std::string ck = o.checkpoint;
  if (const std::string golden = data_dir() + "/"; ck.rfind(golden, 0) == 0) ck = "golden/" + ck.substr(golden.size());
  s.export_command = "tinygpt export --format " + engine.format() + " model." + engine.format() + (ck.empty() ? std::string() : " --checkpoint " + ck);
  const EnginePrecision precision{o.kv_type, o.weight_type};
  const ReplayEngineFactory fresh = [&o, precision] {
    return std::unique_ptr<ReplayEngine>(std::make_unique<LoadedReplay>(
        std::make_unique<LoadedEngine>(o.engine, o.checkpoint, o.timeout_s, nullptr, precision)));
  };
  std::vector<ReproResult> out;
  std::map<std::string, ReproResult> by_sender;  // a bundle per sender: rows judging one run share it
  for (const RowRequests& r : transcripts) {
    ReproResult res;
    std::string by_kl;
    bound_of(r.sender, by_kl);
    if (!by_kl.empty()) {
      res.row = r.row;
      res.why_not = "the engine declares " + by_kl + ", judged by mean KL: a bundle judges each answer by max |diff|";
    } else if (const auto it = by_sender.find(r.sender); it != by_sender.end()) {
      res = it->second;
    } else {
      s.row = r.sender;
      res = reproduce(r.t, s, engine.model(), fresh, say);
      // A row whose requests a fresh engine answers right may fail on what the engine kept from before
      // it (a reset that keeps the main run's row): the main run's requests first, then its own.
      if (!res.ok() && res.right_alone && !r.before.exchanges.empty() && !r.before.overflowed) {
        say(r.sender + ": its requests pass on a fresh engine; again after the " + std::to_string(r.before.exchanges.size()) +
            " requests of the main run (" + r.before_sender + ")");
        Transcript both = r.before;
        both.exchanges.insert(both.exchanges.end(), r.t.exchanges.begin(), r.t.exchanges.end());
        both.overflowed = r.t.overflowed;
        s.after_row = r.before_sender, s.after_requests = r.before.exchanges.size();
        ReproResult again = reproduce(both, s, engine.model(), fresh, say);
        s.after_row.clear(), s.after_requests = 0;
        if (again.ok()) again.after = r.before_sender, res = again;
        else if (again.right_alone) res.why_not += ", after the main run's requests too";
      }
      by_sender[r.sender] = res;
      if (!res.ok()) say(r.sender + ": no reproduction: " + res.why_not);
    }
    res.row = r.row;
    if (r.sender != r.row) res.sent_by = r.sender;
    out.push_back(res);
  }
  return out;
}

}  // namespace

ConformReport run_conform(const ConformOptions& o) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  ConformReport rep;
  rep.command = o.engine;
  const std::vector<std::string> names = conform_selection(o.groups, o.deep);
  check_repro(o);
  at::NoGradGuard no_grad;
  const EnginePrecision precision{o.kv_type, o.weight_type};
  LoadedEngine engine(o.engine, o.checkpoint, o.timeout_s, o.progress, precision);
  rep.kv_type = o.kv_type;
  rep.weight_type = o.weight_type;
  rep.checkpoint = engine.checkpoint();
  rep.engine_name = engine.name();
  rep.format = engine.format();
  rep.protocol = engine.protocol();
  GPT& model = engine.model();
  const Config& cfg = model->config();
  EngineProcess& proc = engine.process();
  RemoteTarget target(proc, engine.hello(), cfg.vocab_size, cfg.context);
  // save-restore's fresh context: the same command started again, greeted and loaded the same way.
  target.set_spawn(second_instances(o, cfg, precision));
  rep.deviations = target.offers().deviations;
  const Deviation* inside_by = nullptr;  // a declared deviation that keeps the run inside the window
  for (const auto& name : rep.deviations)
    if (const Deviation* d = find_deviation(name); d && d->inside_window) {
      inside_by = d;
      break;
    }
  EquivalenceOptions eo = conform_run_options(o, cfg, inside_by);
  // The speculative rows' trained draft (the fixture's golden/draft.safetensors: it shares the
  // vocabulary of every model here), sent in the engine's format on first use.
  Checkpoint draft_ck;
  if (target.offers().why_not_speculate("model", AcceptRule::Exact).empty()) {
    const std::string path = data_dir() + "/draft.safetensors";
    if (std::filesystem::exists(path)) {
      draft_ck = read_any_checkpoint(path);
      GPT d = model_from_checkpoint(draft_ck, c10::Device(c10::kCPU), path);
      if (d->config().vocab_size == cfg.vocab_size) eo.draft = d;
    }
    target.set_draft_writer([&engine, &draft_ck, &say](GPT& d) {
      say("writing the speculative draft for the engine");
      return engine.write_model(draft_ck, d, "draft");
    });
  }
  eo.spec_draws = o.spec_draws;
  rep.past_window = eo.past_window;
  // A low-precision KV type or weights: the same engine at f32 (cache, weights) is sent every request
  // too, and each row says what the precision costs against it (MirrorTarget), judged by the budget.
  std::unique_ptr<LoadedEngine> base_engine;
  std::unique_ptr<RemoteTarget> base_target;
  std::unique_ptr<MirrorTarget> mirror;
  auto lists_f32 = [](const std::vector<std::string>& l) { return std::find(l.begin(), l.end(), "f32") != l.end(); };
  // An engine that takes whole requests only (hello's "rows": false) cannot be mirrored request by
  // request: its rows are judged against our model alone, and the weight-budget row says why it is not run.
  const bool takes_rows = target.offers().takes_rows();
  const bool kv_base = takes_rows && low_kv(o) && lists_f32(hello_kv_types(engine.hello()));
  const bool weight_base = takes_rows && low_weights(o) && lists_f32(hello_weight_types(engine.hello()));
  const EnginePrecision base_precision{kv_base ? "f32" : o.kv_type, weight_base ? "f32" : o.weight_type};
  const MirrorLabels labels(kv_base, weight_base);
  if (kv_base || weight_base) {
    say("the baseline: the same engine with " + labels.words + ", sent every request");
    base_engine = std::make_unique<LoadedEngine>(o.engine, o.checkpoint, o.timeout_s, nullptr, base_precision);
    base_target = std::make_unique<RemoteTarget>(base_engine->process(), base_engine->hello(), cfg.vocab_size, cfg.context);
    base_target->set_spawn(second_instances(o, cfg, base_precision));
    mirror = std::make_unique<MirrorTarget>(target, *base_target);
  }
  DecodeTarget& judged = mirror ? static_cast<DecodeTarget&>(*mirror) : target;

  // Declared deviations: a row each, saying what it relaxes; the rows they touch are judged by the
  // deviation's bound and say so (run_check).
  for (const auto& name : rep.deviations) rep.rows.push_back(declared_row(name));
  rep.model = conform_figures(eo, cfg, target.name());
  CheckContext ctx(model, eo, judged, rep.model);
  ctx.progress = say;
  Tolerances kv_bounds;  // the precision's budget, judged like any bound (judge.h)
  kv_bounds.max_kl = precision_budget(o).value_or(o.kv_budget);
  kv_bounds.min_top1 = o.kv_min_top1;
  std::vector<RowRequests> transcripts;
  run_rows(names, ctx, target, rep, say, mirror.get(), kv_bounds, labels, o.repro_dir.empty() ? nullptr : &transcripts);
  rep.model.checks = rep.rows;
  if (!transcripts.empty()) rep.repros = reproduce_rows(o, transcripts, engine, rep, eo, say);
  if (!rep.fatal && (!o.kv_type.empty() || !o.kv_compare.empty())) {
    try {
      // The f32-cache baseline at the same weights (the one already running holds f32 weights too
      // when the weights are quantized: kv_costs starts its own then).
      rep.kv = kv_costs(o, engine.hello(), target, eo, ctx.ref(), cfg.vocab_size, cfg.context, weight_base ? nullptr : base_target.get());
      for (const auto& k : rep.kv) rep.rows.push_back(kv_budget_row(k));
    } catch (const EngineUnusable&) {
      throw;
    } catch (const std::exception& e) {  // an engine that refuses a type it lists, or fails the run: this row fails
      CheckResult r;
      r.name = "kv-budget";
      r.status = Status::Error;
      r.detail = std::string("the KV-type runs could not finish: ") + e.what();
      rep.rows.push_back(r);
    }
  }
  if (!rep.fatal && low_weights(o) && !takes_rows) {
    CheckResult r;
    r.name = "weight-budget [" + o.weight_type + "]";
    r.status = Status::Skipped;
    r.detail = "skipped: " + target.offers().no_rows + " (the teacher-forced run it costs needs rows); the rows it serves are judged "
               "against our model by the budget";
    rep.rows.push_back(r);
  } else if (!rep.fatal && low_weights(o)) {
    // What the weights cost, llama-perplexity's figures (the baseline running already holds f32 weights
    // at this run's cache type unless its cache is f32 too: weight_cost starts one then).
    try {
      rep.kv.push_back(weight_cost(o, engine.hello(), target, eo, ctx.ref(), cfg.vocab_size, cfg.context,
                                   weight_base && !kv_base ? base_target.get() : nullptr));
      rep.rows.push_back(kv_budget_row(rep.kv.back()));
    } catch (const EngineUnusable&) {
      throw;
    } catch (const std::exception& e) {
      CheckResult r;
      r.name = "weight-budget";
      r.status = Status::Error;
      r.detail = std::string("the weight-type run could not finish: ") + e.what();
      rep.rows.push_back(r);
    }
  }
  if (base_engine) base_engine->process().quit();
  if (!rep.fatal && !proc.quit()) {
    CheckResult q;
    q.name = "quit";
    q.status = Status::Fail;
    q.detail = "the engine did not exit 0 after 'quit'";
    rep.rows.push_back(q);
  }
  rep.requests = proc.requests();
  if (o.diagnose && !rep.fatal) rep.diagnosis = diagnose(model, eo, rep.rows, say);
  return rep;
}

}  // namespace tinygpt::checks
