#include "remote_target.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace tinygpt::checks {

using nlohmann::json;

json ids_json(const at::Tensor& ids) {  // (B, T) int64 -> [[...], ...]
  at::Tensor c = ids.to(at::kCPU).to(at::kLong).contiguous();
  json rows = json::array();
  for (int64_t b = 0; b < c.size(0); ++b) {
    const int64_t* p = c[b].data_ptr<int64_t>();
    rows.push_back(std::vector<int64_t>(p, p + c.size(1)));
  }
  return rows;
}

RemoteTarget::RemoteTarget(EngineProcess& p, const json& hello, int64_t vocab, int64_t context)
    : p_(p), name_("engine '" + engine_text(hello.value("name", std::string("(unnamed)")), 80) + "'"), vocab_(vocab), context_(context) {
  has_sampler_ = !(hello.contains("sampler") && hello["sampler"].is_boolean() && !hello["sampler"].get<bool>());
  takes_rows_ = !(hello.contains("rows") && hello["rows"].is_boolean() && !hello["rows"].get<bool>());
  if (hello.contains("protocol") && hello["protocol"].is_number_integer()) protocol_ = hello["protocol"].get<int>();
  if (hello.contains("max_rows") && hello["max_rows"].is_number_integer()) max_rows_ = hello["max_rows"].get<int64_t>();
  if (hello.contains("operations") && hello["operations"].is_array())
    for (const auto& o : hello["operations"])
      if (o.is_string()) operations_.push_back(o.get<std::string>());
  if (hello.contains("deviations") && hello["deviations"].is_array())
    for (const auto& d : hello["deviations"])
      if (d.is_string()) deviations_.push_back(d.get<std::string>());
  if (hello.contains("speculate") && hello["speculate"].is_object()) {
    for (const auto& [field, out] : {std::pair<const char*, std::vector<std::string>*>{"drafts", &drafts_}, {"rules", &rules_}})
      if (hello["speculate"].contains(field))
        for (const auto& d : hello["speculate"][field]) out->push_back(d.get<std::string>());
  }
  sampler_ = {name_, "the engine's sampler through 'sample'", nullptr,
              [this](const at::Tensor& l, const at::Tensor& h, const SamplingSettings& s) { return pick(l, h, s); }, nullptr};
  if (why_not(Op::RowSampling).empty())
    sampler_.pick_rows = [this](const at::Tensor& l, const at::Tensor& h, const std::vector<RowSampling>& r, int64_t n) {
      return pick_rows(l, h, r, n);
    };
}

json RemoteTarget::ok(const json& req) {
  if (unusable_) throw EngineUnusable(*unusable_);
  json a;
  try {
    a = p_.call(req);
  } catch (const EngineUnusable& e) {
    unusable_ = e.what();
    throw;
  }
  if (transcript_) {  // the answer less its logits: what later requests name
    if (transcript_->exchanges.size() < kTranscriptLimit) {
      json kept = json::object();
      for (const char* k : {"ok", "error", "rows", "row", "state", "reused"})
        if (a.contains(k)) kept[k] = a[k];
      transcript_->exchanges.push_back({req, std::move(kept)});
    } else {
      transcript_->overflowed = true;
    }
  }
  if (!a["ok"].get<bool>())
    throw WrongAnswer("'" + req["op"].get<std::string>() + "' answered ok false: " + engine_text(a["error"].get<std::string>()));
  return a;
}

void RemoteTarget::reset() { ok({{"op", "reset"}}); }

at::Tensor RemoteTarget::prefill(const at::Tensor& ids) {
  return logits(ok({{"op", "prefill"}, {"ids", ids_json(ids)}}), ids.size(0), "prefill");
}

at::Tensor RemoteTarget::step(const at::Tensor& ids) {
  return logits(ok({{"op", "step"}, {"ids", ids_json(ids)}}), ids.size(0), "step");
}

Offers RemoteTarget::make_offers() const {
  Offers o;
  for (unsigned i = 0; i < kOpCount; ++i) o.missing[i] = why_not(static_cast<Op>(i));
  if (!takes_rows_) o.no_rows = "the engine takes whole requests only (its hello says \"rows\": false): no prefill or step of a row";
  o.max_rows = max_rows_;
  o.deviations = deviations_;
  if (!has_sampler_) o.no_sampler = "the engine has no sampler (its hello says \"sampler\": false)";
  if (!spawn_) o.no_second_instance = "no second process of the engine was asked for";
  for (const std::string& d : draft_kinds())
    if (std::find(drafts_.begin(), drafts_.end(), d) == drafts_.end())
      o.drafts_missing[d] = "the engine does not draft with '" + d + "' (its hello's speculate drafts: " + engine_json(json(drafts_)) + ")";
  for (const AcceptRule r : {AcceptRule::Exact, AcceptRule::SampleAndMatch})
    if (std::find(rules_.begin(), rules_.end(), accept_rule_name(r)) == rules_.end())
      o.rules_missing[accept_rule_name(r)] = std::string("the engine does not accept by the ") + accept_rule_name(r) +
                                             " rule (its hello's speculate rules: " + engine_json(json(rules_)) + ")";
  return o;
}

const props::SamplerUnderTest& RemoteTarget::sampler() const {
  if (!has_sampler_) throw std::logic_error(offers().no_sampler);
  return sampler_;
}

RowServing& RemoteTarget::serving() {
  if (protocol_ < 2) throw std::logic_error(offers().why_not(Op::Ragged));
  return *this;
}

std::unique_ptr<DecodeTarget> RemoteTarget::second_instance() const {
  if (!spawn_) throw std::logic_error(offers().no_second_instance);
  return spawn_();
}

std::string RemoteTarget::why_not(Op op) const {
  const std::string name = op_name(op);
  if (protocol_ < 2) return "the engine speaks protocol 1 (its hello names no operations)";
  if (protocol_ < 3 && (op == Op::Extend || op == Op::Save || op == Op::Shift || op == Op::Generate || op == Op::GenerateShift))
    return "the engine speaks protocol 2 (" + name + " is protocol 3's)";
  if (std::find(operations_.begin(), operations_.end(), name) == operations_.end())
    return "the engine does not support " + name + " (its hello's operations: " + engine_json(json(operations_)) + ")";
  return "";
}

namespace {
json rows_of_ids(const std::vector<std::vector<int64_t>>& prompts) {
  json rows = json::array();
  for (const auto& p : prompts) rows.push_back(p);
  return rows;
}
}  // namespace

// The fields of hello that the suite reads, each of the type docs/protocol.md gives it; an engine
// that answers otherwise cannot be talked to (exit 2), rather than being half understood.
void check_hello(const json& h) {
  auto bad = [&](const std::string& what) { throw EngineUnusable("engine: 'hello' answered " + what + ": " + engine_text(h.dump(-1, ' ', false, json::error_handler_t::replace))); };
  if (h.contains("name") && !h["name"].is_string()) bad("a \"name\" that is not a string");
  if (h.contains("protocol")) {
    if (!h["protocol"].is_number_integer()) bad("a \"protocol\" that is not an integer");
    const int64_t p = h["protocol"].get<int64_t>();
    if (p < 1 || p > kProtocol)
      bad("protocol " + std::to_string(p) + ", which this suite does not speak (it speaks 1 to " + std::to_string(kProtocol) + ")");
  }
  for (const char* list : {"operations", "formats", "deviations"}) {
    if (!h.contains(list)) continue;
    if (!h[list].is_array()) bad(std::string("a \"") + list + "\" that is not a list");
    for (const auto& e : h[list])
      if (!e.is_string()) bad(std::string("a \"") + list + "\" entry that is not a string");
  }
  if (h.contains("speculate")) {  // {"drafts": [kinds], "rules": [rules]}, each named as docs/protocol.md names them
    const json& sp = h["speculate"];
    if (!sp.is_object()) bad("a \"speculate\" that is not an object of \"drafts\" and \"rules\"");
    for (const char* list : {"drafts", "rules"}) {
      if (!sp.contains(list) || !sp[list].is_array()) bad(std::string("a \"speculate\" without a \"") + list + "\" list");
      for (const auto& e : sp[list]) {
        const bool known = e.is_string() && (std::string(list) == "drafts"
                                                 ? std::count(draft_kinds().begin(), draft_kinds().end(), e.get<std::string>()) > 0
                                                 : e == "exact" || e == "sample-and-match");
        if (!known) bad(std::string("a \"speculate\" ") + list + " entry it does not know");
      }
    }
  }
  if (h.contains("sampler") && !h["sampler"].is_boolean()) bad("a \"sampler\" that is not true or false");
  if (h.contains("rows") && !h["rows"].is_boolean()) bad("a \"rows\" that is not true or false");
  if (h.contains("max_rows") && (!h["max_rows"].is_number_integer() || h["max_rows"].get<int64_t>() < 1))
    bad("a \"max_rows\" that is not a positive integer");
}

int64_t answer_row(const json& a, const std::string& op) {
  if (!a.contains("row") || !a["row"].is_number_integer()) throw WrongAnswer("'" + op + "' answered without an integer \"row\"");
  return a["row"].get<int64_t>();
}

std::vector<int64_t> answer_rows(const json& a, size_t n) {
  if (!a.contains("rows") || !a["rows"].is_array() || a["rows"].size() != n)
    throw WrongAnswer("'prefill' answered without \"rows\": the ids of the " + std::to_string(n) + " new rows");
  std::vector<int64_t> ids;
  for (const auto& r : a["rows"]) {
    if (!r.is_number_integer()) throw WrongAnswer("'prefill' answered a row id that is not an integer: " + engine_json(r));
    ids.push_back(r.get<int64_t>());
  }
  return ids;
}

std::vector<int64_t> answer_reused(const json& a, const std::vector<std::vector<int64_t>>& prompts) {
  if (!a.contains("reused")) return {};
  const json& r = a["reused"];
  if (!r.is_array() || r.size() != prompts.size())
    throw WrongAnswer("'prefill' answered \"reused\" that is not a list of " + std::to_string(prompts.size()) + " counts: " + engine_json(r));
  std::vector<int64_t> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!r[i].is_number_integer() || r[i].get<int64_t>() < 0 || r[i].get<int64_t>() > static_cast<int64_t>(prompts[i].size()))
      throw WrongAnswer("'prefill' answered \"reused\" " + engine_json(r[i]) + " for a " + std::to_string(prompts[i].size()) +
                        "-token prompt (a count in [0, its length])");
    out.push_back(r[i].get<int64_t>());
  }
  return out;
}

int answer_before(const json& a) {
  if (!a.contains("before") || !a["before"].is_number_integer() || a["before"].get<int64_t>() < 1 ||
      a["before"].get<int64_t>() > 1 << 20)
    throw WrongAnswer("'threads' answered without \"before\": the thread count it ran with, a positive integer");
  return a["before"].get<int>();
}

std::vector<std::vector<int64_t>> answer_sample_ids(const json& a, size_t rows, int64_t n, int64_t V) {
  const json& ids = a.contains("ids") ? a["ids"] : json();
  if (!ids.is_array() || ids.size() != rows)
    throw WrongAnswer("'sample' answered without \"ids\" as " + std::to_string(rows) + " rows");
  std::vector<std::vector<int64_t>> out;
  for (const json& r : ids) {
    if (!r.is_array() || static_cast<int64_t>(r.size()) != n)
      throw WrongAnswer("'sample' answered a row without " + std::to_string(n) + " ids");
    std::vector<int64_t> row;
    for (const json& id : r) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= V)
        throw WrongAnswer("'sample' answered id " + engine_json(id) + ", outside [0, " + std::to_string(V) + ")");
      row.push_back(id.get<int64_t>());
    }
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<int64_t> RemoteTarget::add_rows(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& out) {
  const json a = ok({{"op", "prefill"}, {"ids", rows_of_ids(prompts)}});
  out = logits(a, static_cast<int64_t>(prompts.size()), "prefill");
  std::vector<int64_t> rows = answer_rows(a, prompts.size());
  reused_ = answer_reused(a, prompts);
  return rows;
}

at::Tensor RemoteTarget::step_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids) {
  json col = json::array();
  for (int64_t id : ids) col.push_back(json::array({id}));
  return logits(ok({{"op", "step"}, {"rows", rows}, {"ids", col}}), static_cast<int64_t>(rows.size()), "step");
}

at::Tensor RemoteTarget::extend_row(int64_t row, const std::vector<int64_t>& ids) {
  return logits(ok({{"op", "extend"}, {"row", row}, {"ids", ids}}), 1, "extend")[0];
}
int64_t RemoteTarget::fork_row(int64_t row) { return answer_row(ok({{"op", "fork"}, {"row", row}}), "fork"); }
void RemoteTarget::truncate_row(int64_t row, int64_t n) { ok({{"op", "truncate"}, {"row", row}, {"n", n}}); }
void RemoteTarget::release_row(int64_t row) { ok({{"op", "release"}, {"row", row}}); }
int RemoteTarget::set_threads(int n) { return answer_before(ok({{"op", "threads"}, {"n", n}})); }
std::string RemoteTarget::save_row(int64_t row) { return answer_state(ok({{"op", "save"}, {"row", row}})); }
int64_t RemoteTarget::restore_row(const std::string& state) { return answer_row(ok({{"op", "restore"}, {"state", state}}), "restore"); }
void RemoteTarget::shift_row(int64_t row, int64_t keep, int64_t discard) {
  ok({{"op", "shift"}, {"row", row}, {"keep", keep}, {"discard", discard}});
}

std::vector<ServedResult> RemoteTarget::serve(const std::vector<ServedRequest>& requests) {
  json rs = json::array();
  for (const ServedRequest& q : requests) {
    json r = {{"id", q.id}, {"ids", q.prompt}, {"n", q.n}};
    if (q.after) r["after"] = q.after;
    if (!q.after_finished.empty()) r["after_finished"] = q.after_finished;
    if (q.copies != 1) r["copies"] = q.copies;
    if (q.keep >= 0) r["keep"] = q.keep;
    rs.push_back(std::move(r));
  }
  return answer_served(ok({{"op", "generate"}, {"requests", rs}}), requests, vocab_);
}

namespace {
// One step's top-N log-probabilities, each [id in [0, V), a finite log-probability <= 0 (1e-3 of float
// slack)]; `who` begins the wrong answer's message ("'generate' answered request 3 copy 0").
std::vector<std::pair<int64_t, double>> top_entries(const json& step, int64_t V, const std::string& who) {
  std::vector<std::pair<int64_t, double>> entries;
  for (const json& e : step) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer() || e[0].get<int64_t>() < 0 || e[0].get<int64_t>() >= V ||
        !e[1].is_number() || !std::isfinite(e[1].get<double>()) || e[1].get<double>() > 1e-3)
      throw WrongAnswer(who + " a top entry that is not [id, log-probability]: " + engine_json(e));
    entries.emplace_back(e[0].get<int64_t>(), e[1].get<double>());
  }
  return entries;
}
}  // namespace

SpeculativeAnswer RemoteTarget::speculate(const SpeculativeRequest& q) {
  const std::string why = offers().why_not_speculate(q.draft, q.settings.rule);
  if (!why.empty()) throw std::logic_error(why);
  const SpeculativeSettings& s = q.settings;
  json r = {{"op", "speculate"}, {"ids", q.prompt},       {"n", q.n},
            {"draft", q.draft},  {"k", s.k},              {"rule", accept_rule_name(s.rule)},
            {"temperature", s.sampling.temperature},      {"top_k", s.sampling.top_k},
            {"top_p", s.sampling.top_p},                  {"penalty", s.sampling.penalty},
            {"seed", s.seed},    {"stop", s.stop},        {"then", q.then_plain}};
  if (q.draft == "replay") r["replay"] = q.replay, r["replay_shift"] = q.replay_shift, r["replay_period"] = q.replay_period;
  if (q.draft == "model") {
    if (!q.draft_model || !draft_writer_) throw std::logic_error("speculate: the draft 'model' needs a draft model and a way to send it");
    auto [it, fresh] = draft_files_.try_emplace(q.draft_model.get());
    if (fresh) it->second = draft_writer_(const_cast<GPT&>(q.draft_model));
    r["draft_model"] = it->second;
  }
  return answer_speculated(ok(r), q, vocab_);
}

Generation RemoteTarget::seeded(const at::Tensor& prompt, int64_t n, const SamplingSettings& s, uint64_t seed) {
  SpeculativeRequest q;
  const at::Tensor p = prompt.to(at::kCPU).to(at::kLong).contiguous();  // (1, T0)
  q.prompt.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
  q.n = n;
  q.draft = "none";
  q.settings.k = 1;
  q.settings.rule = AcceptRule::SampleAndMatch;
  q.settings.sampling = s;
  q.settings.seed = seed;
  SpeculativeAnswer run;
  try {
    run = speculate(q);
  } catch (const WrongAnswer& e) {
    throw WrongAnswer(std::string("plain decoding (draft none): ") + e.what());
  }
  if (static_cast<int64_t>(run.ids.size()) != n)
    throw WrongAnswer("'speculate' with no drafts answered " + std::to_string(run.ids.size()) + " ids for " + std::to_string(n));
  Generation g;
  g.seq = at::cat({p, at::tensor(run.ids, at::kLong).unsqueeze(0)}, 1).to(prompt.device());  // (1, T0 + n)
  if (run.logits.defined()) g.logits = run.logits.unsqueeze(0);                               // (1, n, V)
  return g;
}

SpeculativeAnswer answer_speculated(const json& a, const SpeculativeRequest& q, int64_t V) {
  auto ids_of = [&](const char* field, size_t most, bool exact) {
    const json& l = a.contains(field) ? a[field] : json();
    if (!l.is_array()) throw WrongAnswer(std::string("'speculate' answered without \"") + field + "\", a list of ids");
    if (l.size() > most)  // more than asked for: past the budget (a block emitted whole where it ran over)
      throw WrongAnswer(std::string("'speculate' answered ") + std::to_string(l.size()) + " " + field + " for a budget of " +
                        std::to_string(most) + ": " + std::to_string(l.size() - most) + " past it");
    if (exact && l.size() != most)
      throw WrongAnswer(std::string("'speculate' answered ") + std::to_string(l.size()) + " " + field + " for a budget of " +
                        std::to_string(most) + " and no stop id among them");
    std::vector<int64_t> out;
    for (const json& id : l) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= V)
        throw WrongAnswer(std::string("'speculate' answered ") + field + " id " + engine_json(id) + ", outside [0, " + std::to_string(V) + ")");
      out.push_back(id.get<int64_t>());
    }
    return out;
  };
  auto count = [&](const char* field) {
    if (!a.contains(field) || !a[field].is_number_integer() || a[field].get<int64_t>() < 0)
      throw WrongAnswer(std::string("'speculate' answered without \"") + field + "\", a count >= 0");
    return a[field].get<int64_t>();
  };
  SpeculativeAnswer run;
  run.ids = ids_of("ids", static_cast<size_t>(q.n), q.settings.stop.empty());
  if (run.ids.empty()) throw WrongAnswer("'speculate' answered no ids");
  const size_t m = run.ids.size();
  if (a.contains("logits")) {
    run.logits = answer_logits(a, static_cast<int64_t>(m), V, "speculate");  // (m, V)
  } else if (a.contains("top")) {  // top-N log-probabilities per id, where the engine gives no more
    if (!a["top"].is_array() || a["top"].size() != m)
      throw WrongAnswer("'speculate' answered \"top\" that is not one list per id (" + std::to_string(m) + ")");
    for (const json& step : a["top"]) {
      if (!step.is_array() || step.empty())
        throw WrongAnswer("'speculate' answered id " + std::to_string(run.top.size()) + " of " + std::to_string(m) +
                          " without top log-probabilities (an empty list)");
      run.top.push_back(top_entries(step, V, "'speculate' answered"));
    }
  }
  // The engine's counts; "rounds" where it can say (0: it does not).
  run.rounds = a.contains("rounds") ? count("rounds") : 0, run.drafted = count("drafted"), run.accepted = count("accepted");
  if (run.accepted > run.drafted)
    throw WrongAnswer("'speculate' answered " + std::to_string(run.accepted) + " drafts accepted of " + std::to_string(run.drafted));
  if (a.contains("accepted_per_round")) {
    const json& per = a["accepted_per_round"];
    int64_t sum = 0;
    if (!per.is_array() || static_cast<int64_t>(per.size()) != run.rounds)
      throw WrongAnswer("'speculate' answered \"accepted_per_round\" that is not one count per round (" + std::to_string(run.rounds) + ")");
    for (const json& c : per) {
      if (!c.is_number_integer() || c.get<int64_t>() < 0) throw WrongAnswer("'speculate' answered a round's count that is not >= 0");
      run.accepted_per_round.push_back(c.get<int64_t>());
      sum += c.get<int64_t>();
    }
    if (sum != run.accepted)
      throw WrongAnswer("'speculate' answered rounds that accepted " + std::to_string(sum) + " drafts in all, and \"accepted\" " +
                        std::to_string(run.accepted));
  }
  run.stopped = !q.settings.stop.empty() && std::count(q.settings.stop.begin(), q.settings.stop.end(), run.ids.back()) > 0;
  if (q.then_plain > 0) {
    json then = {{"logits", a.contains("then_logits") ? a["then_logits"] : json()}};
    run.then_ids = ids_of("then_ids", static_cast<size_t>(q.then_plain), true);
    run.then_logits = answer_logits(then, q.then_plain, V, "speculate (then_logits)");  // (then, V)
  }
  return run;
}

std::vector<ServedResult> answer_served(const json& a, const std::vector<ServedRequest>& requests, int64_t V) {
  const json& rs = a.contains("results") ? a["results"] : json();
  if (!rs.is_array()) throw WrongAnswer("'generate' answered without \"results\": a list of every sequence asked for");
  std::map<int64_t, const ServedRequest*> asked;
  size_t sequences = 0;
  for (const ServedRequest& q : requests) asked[q.id] = &q, sequences += static_cast<size_t>(q.copies);
  std::map<std::pair<int64_t, int64_t>, bool> seen;
  std::vector<ServedResult> out;
  for (const json& r : rs) {
    if (!r.is_object() || !r.contains("id") || !r["id"].is_number_integer() || !asked.count(r["id"].get<int64_t>()))
      throw WrongAnswer("'generate' answered a result for no request it was sent: " + engine_json(r));
    const ServedRequest& q = *asked[r["id"].get<int64_t>()];
    ServedResult res;
    res.id = q.id;
    res.copy = r.contains("copy") && r["copy"].is_number_integer() ? r["copy"].get<int64_t>() : 0;
    const std::string which = "request " + std::to_string(q.id) + " copy " + std::to_string(res.copy);
    if (res.copy < 0 || res.copy >= q.copies || seen[{q.id, res.copy}])
      throw WrongAnswer("'generate' answered " + which + " twice, or a copy it was not asked for (" + std::to_string(q.copies) + " asked)");
    seen[{q.id, res.copy}] = true;
    if (!r.contains("ids") || !r["ids"].is_array() || static_cast<int64_t>(r["ids"].size()) != q.n)
      throw WrongAnswer("'generate' answered " + which + " without " + std::to_string(q.n) + " ids");
    for (const json& id : r["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= V)
        throw WrongAnswer("'generate' answered " + which + " an id outside [0, " + std::to_string(V) + "): " + engine_json(id));
      res.ids.push_back(id.get<int64_t>());
    }
    if (r.contains("logits")) {
      res.logits = answer_logits(r, q.n, V, "generate (" + which + ")");
    } else if (r.contains("top") && r["top"].is_array() && static_cast<int64_t>(r["top"].size()) == q.n) {
      for (const json& step : r["top"]) {
        if (!step.is_array() || step.empty()) throw WrongAnswer("'generate' answered " + which + " a step without top log-probabilities");
        res.top.push_back(top_entries(step, V, "'generate' answered " + which));
      }
    } else {
      throw WrongAnswer("'generate' answered " + which + " without \"logits\" (" + std::to_string(q.n) +
                        " rows) or \"top\" (" + std::to_string(q.n) + " lists): what its ids were chosen from");
    }
    if (r.contains("reused")) {
      if (!r["reused"].is_number_integer() || r["reused"].get<int64_t>() < 0 ||
          r["reused"].get<int64_t>() > static_cast<int64_t>(q.prompt.size()))
        throw WrongAnswer("'generate' answered " + which + " \"reused\" " + engine_json(r["reused"]) + " for a " +
                          std::to_string(q.prompt.size()) + "-token prompt");
      res.reused = r["reused"].get<int64_t>();
    }
    if (r.contains("shifts")) {  // each {before, keep, discard}, in order, only where the request allowed shifting
      const json& sh = r["shifts"];
      if (!sh.is_array() || (q.keep < 0 && !sh.empty()))
        throw WrongAnswer("'generate' answered " + which + " \"shifts\" it was not asked to make: " + engine_json(sh));
      int64_t last = -1;
      for (const json& e : sh) {
        auto field = [&](const char* k) { return e.is_object() && e.contains(k) && e[k].is_number_integer() ? e[k].get<int64_t>() : -1; };
        const ServedShift shift{field("before"), field("keep"), field("discard")};
        if (shift.before <= last || shift.before >= q.n || shift.keep < 0 || shift.discard < 1)
          throw WrongAnswer("'generate' answered " + which + " a shift that is not {before, keep, discard} in order within its " +
                            std::to_string(q.n) + " ids: " + engine_json(e));
        last = shift.before;
        res.shifts.push_back(shift);
      }
    }
    out.push_back(std::move(res));
  }
  if (out.size() != sequences)
    for (const ServedRequest& q : requests)
      for (int64_t c = 0; c < q.copies; ++c)
        if (!seen[{q.id, c}])
          throw WrongAnswer("'generate' answered no result for request " + std::to_string(q.id) + " copy " + std::to_string(c) + " (" +
                            std::to_string(out.size()) + " of " + std::to_string(sequences) + " sequences came back)");
  return out;
}

std::string answer_state(const json& a) {
  if (!a.contains("state") || !a["state"].is_string() || a["state"].get_ref<const std::string&>().empty())
    throw WrongAnswer("'save' answered without \"state\": the row's state as a non-empty string");
  return a["state"].get<std::string>();
}

at::Tensor answer_logits(const json& a, int64_t rows, int64_t vocab_, const std::string& op) {
  if (!a.contains("logits") || !a["logits"].is_array() || static_cast<int64_t>(a["logits"].size()) != rows)
    throw WrongAnswer("'" + op + "' answered without \"logits\" as " + std::to_string(rows) + " rows");
  at::Tensor out = at::empty({rows, vocab_}, at::kFloat);
  float* o = out.data_ptr<float>();
  for (int64_t b = 0; b < rows; ++b) {
    const json& r = a["logits"][b];
    if (!r.is_array() || static_cast<int64_t>(r.size()) != vocab_)
      throw WrongAnswer("'" + op + "' answered row " + std::to_string(b) + " with " +
                        (r.is_array() ? std::to_string(r.size()) : std::string("no")) + " logits, expected " +
                        std::to_string(vocab_));
    for (int64_t v = 0; v < vocab_; ++v) {
      const json& x = r[v];
      if (!x.is_number() || !std::isfinite(x.get<double>()))
        throw WrongAnswer("'" + op + "' answered a logit that is not a finite number at row " + std::to_string(b) + ", id " +
                          std::to_string(v) + ": " + engine_json(x));
      o[b * vocab_ + v] = x.get<float>();
    }
  }
  return out;
}

namespace {

// A row of logits (V) as the protocol carries it: a masked score is the string "-inf" (JSON has no
// infinities); NaN or +inf cannot be sent.
json logits_row(const at::Tensor& row) {
  json r = json::array();
  const float* xp = row.data_ptr<float>();
  for (int64_t v = 0; v < row.size(0); ++v) {
    if (std::isfinite(xp[v])) r.push_back(xp[v]);
    else if (xp[v] < 0 && std::isinf(xp[v])) r.push_back("-inf");
    else throw std::invalid_argument("conform: a law made a logit the protocol cannot carry");
  }
  return r;
}

json history_row(const at::Tensor& h, int64_t b) {  // h (B, T) int64 contiguous, or undefined
  if (!h.defined() || h.size(1) == 0) return json::array();
  return std::vector<int64_t>(h[b].data_ptr<int64_t>(), h[b].data_ptr<int64_t>() + h.size(1));
}

}  // namespace

at::Tensor RemoteTarget::pick_rows(const at::Tensor& logits, const at::Tensor& history, const std::vector<RowSampling>& rows, int64_t n) {
  at::Tensor x = logits.to(at::kCPU).to(at::kFloat).contiguous();  // (B, V)
  at::Tensor h = history.defined() ? history.to(at::kCPU).to(at::kLong).contiguous() : at::Tensor();
  json ls = json::array(), hs = json::array(), settings = json::array();
  for (int64_t b = 0; b < x.size(0); ++b) {
    ls.push_back(logits_row(x[b]));
    hs.push_back(history_row(h, b));
    const SamplingSettings& s = rows.at(static_cast<size_t>(b)).settings;
    json r = {{"temperature", s.temperature}, {"top_k", s.top_k}, {"top_p", s.top_p}, {"penalty", s.penalty}};
    if (rows[static_cast<size_t>(b)].seed) r["seed"] = *rows[static_cast<size_t>(b)].seed;
    settings.push_back(std::move(r));
  }
  const auto ids = answer_sample_ids(ok({{"op", "sample"}, {"logits", ls}, {"history", hs}, {"rows", settings}, {"n", n}}),
                                     static_cast<size_t>(x.size(0)), n, x.size(1));
  at::Tensor out = at::empty({x.size(0), n}, at::kLong);
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t i = 0; i < n; ++i) out[b][i] = ids[static_cast<size_t>(b)][static_cast<size_t>(i)];
  return out.to(logits.device());
}

// `pick` through `sample` requests, seeded from LibTorch's default generator (so the laws'
// manual_seed makes draws repeatable). Rows that repeat (x.repeat({N, 1})) go once each with n = N:
// the protocol's draws are independent by contract.
at::Tensor RemoteTarget::pick(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) {
  at::Tensor x = logits.to(at::kCPU).to(at::kFloat).contiguous();
  at::Tensor h = history.defined() ? history.to(at::kCPU).to(at::kLong).contiguous() : at::Tensor();
  const int64_t B = x.size(0), V = x.size(1), T = h.defined() ? h.size(1) : 0;
  // Distinct rows and each row's occurrence number.
  std::map<std::pair<std::vector<float>, std::vector<int64_t>>, int64_t> index;
  std::vector<int64_t> which(B), occurrence(B), count, first_row;
  for (int64_t b = 0; b < B; ++b) {
    const float* xp = x[b].data_ptr<float>();
    std::vector<int64_t> hv;
    if (T) hv.assign(h[b].data_ptr<int64_t>(), h[b].data_ptr<int64_t>() + T);
    auto [it, fresh] = index.try_emplace({std::vector<float>(xp, xp + V), std::move(hv)}, static_cast<int64_t>(count.size()));
    if (fresh) count.push_back(0), first_row.push_back(b);
    which[b] = it->second;
    occurrence[b] = count[it->second]++;
  }
  int64_t n = count[0];
  for (int64_t c : count)
    if (c != n) n = -1;
  std::vector<int64_t> send = first_row;
  if (n < 0) {  // unequal repeats: every row once
    n = 1;
    send.resize(B);
    for (int64_t b = 0; b < B; ++b) send[b] = b, which[b] = b, occurrence[b] = 0;
  }
  json rows = json::array(), hist = json::array();
  for (int64_t b : send) {
    rows.push_back(logits_row(x[b]));
    hist.push_back(history_row(h, b));
  }
  const int64_t seed = at::randint(0, int64_t(1) << 30, {1}, at::kLong).item<int64_t>();
  const json a = ok({{"op", "sample"}, {"logits", rows}, {"history", hist}, {"temperature", s.temperature}, {"top_k", s.top_k},
                     {"top_p", s.top_p}, {"penalty", s.penalty}, {"seed", seed}, {"n", n}});
  const std::vector<std::vector<int64_t>> ids = answer_sample_ids(a, send.size(), n, V);
  at::Tensor out = at::empty({B}, at::kLong);
  for (int64_t b = 0; b < B; ++b) out[b] = ids[which[b]][occurrence[b]];
  return out.to(logits.device());
}

}  // namespace tinygpt::checks
