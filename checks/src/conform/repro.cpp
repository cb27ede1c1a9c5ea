#include "tinygpt/checks/repro.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "engine_process.h"
#include "remote_target.h"
#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/conform.h"
#include "tinygpt/checks/faults.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/checks/target.h"
#include "tinygpt/results/result.h"

namespace tinygpt::checks {

namespace {

using nlohmann::json;
using results::sci;
namespace fs = std::filesystem;

// One request of a replayable sequence, its rows named by handles ("@0", "@1", ...: the k-th row an
// answer made) and its saved states by handles ("@s0", ...) instead of the engine's ids.
struct Call {
  json request;
  std::vector<std::string> creates;  // the rows its answer names, in order (prefill's, fork's, restore's)
  std::vector<std::string> covers;   // a step without "rows": the live rows it steps, in order
  std::string saves;                 // save: its state's handle
  std::string op() const { return request.value("op", std::string()); }
  // The rows a step steps, in the order of its ids.
  std::vector<std::string> stepped() const {
    if (!request.contains("rows")) return covers;
    std::vector<std::string> r;
    for (const json& h : request["rows"]) r.push_back(h.get<std::string>());
    return r;
  }
};
using Calls = std::vector<Call>;

const std::set<std::string>& replayable() {
  static const std::set<std::string> ops(replayed_operations().begin(), replayed_operations().end());
  return ops;
}

std::string handle(int k) { return "@" + std::to_string(k); }

// The transcript as calls on handles. std::runtime_error when it holds a request no reproduction replays.
Calls calls_of(const Transcript& t, int protocol) {
  Calls out;
  std::map<int64_t, std::string> row_handle;  // the engine's id -> the latest row it named
  std::map<std::string, std::string> state_handle;
  std::vector<std::string> live;
  int rows = 0, states = 0;
  auto name = [&](const json& id) {
    const auto it = id.is_number_integer() ? row_handle.find(id.get<int64_t>()) : row_handle.end();
    if (it == row_handle.end()) throw std::runtime_error("a request names row " + engine_json(id) + ", which no answer made");
    return it->second;
  };
  auto made = [&](Call& c, const json& id) {
    const std::string h = handle(rows++);
    c.creates.push_back(h);
    live.push_back(h);
    if (id.is_number_integer()) row_handle[id.get<int64_t>()] = h;
  };
  for (const Exchange& e : t.exchanges) {
    Call c;
    c.request = e.request;
    const std::string op = c.op();
    if (!replayable().count(op)) throw std::runtime_error("it sends '" + op + "', which a reproduction does not replay");
    const json& a = e.answer;
    if (op == "reset") {
      live.clear();
      row_handle.clear();
    } else if (op == "prefill") {
      if (protocol < 2) live.clear(), row_handle.clear();
      const json rows_answered = a.contains("rows") && a["rows"].is_array() ? a["rows"] : json::array();
      for (size_t i = 0; i < c.request["ids"].size(); ++i) made(c, i < rows_answered.size() ? rows_answered[i] : json());
    } else if (op == "step") {
      if (c.request.contains("rows")) {
        json named = json::array();
        for (const json& id : c.request["rows"]) named.push_back(name(id));
        c.request["rows"] = named;
      } else {
        c.covers = live;
      }
    } else if (op == "restore") {
      const auto it = state_handle.find(c.request.value("state", std::string()));
      if (it == state_handle.end()) throw std::runtime_error("it restores a state saved in another process");
      c.request["state"] = it->second;
      made(c, a.value("row", json()));
    } else if (op != "threads" && op != "generate") {  // extend, fork, truncate, release, save, shift: one row
      c.request["row"] = name(c.request.value("row", json()));
      if (op == "fork") made(c, a.value("row", json()));
      if (op == "release") live.erase(std::remove(live.begin(), live.end(), c.request["row"].get<std::string>()), live.end());
      if (op == "save") {
        c.saves = "@s" + std::to_string(states++);
        if (a.contains("state") && a["state"].is_string()) state_handle[a["state"].get<std::string>()] = c.saves;
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The handles numbered again in the order the calls make them (@0, @1, ...; states @s0, ...): what
// shrinking left of the row's numbering reads as gaps.
Calls renumbered(const Calls& calls) {
  std::map<std::string, std::string> to;
  int rows = 0, states = 0;
  for (const Call& c : calls) {
    for (const auto& h : c.creates) to[h] = handle(rows++);
    if (!c.saves.empty()) to[c.saves] = "@s" + std::to_string(states++);
  }
  auto re = [&](const std::string& h) {
    const auto it = to.find(h);
    return it == to.end() ? h : it->second;
  };
  Calls out = calls;
  for (Call& c : out) {
    for (auto& h : c.creates) h = re(h);
    for (auto& h : c.covers) h = re(h);
    if (!c.saves.empty()) c.saves = re(c.saves);
    for (const char* k : {"row", "state"})
      if (c.request.contains(k) && c.request[k].is_string()) c.request[k] = re(c.request[k].get<std::string>());
    if (c.request.contains("rows"))
      for (json& h : c.request["rows"]) h = re(h.get<std::string>());
  }
  return out;
}

std::vector<std::vector<int64_t>> id_lists(const json& j) {
  std::vector<std::vector<int64_t>> out;
  for (const json& r : j) out.push_back(r.get<std::vector<int64_t>>());
  return out;
}

// True when `calls` are one batch per reset - a prefill of rows of one length, then steps of every one of
// its rows without naming them, and nothing else - the main run's shape (protocol 1's whole protocol).
bool batch_path(const Calls& calls) {
  bool prefilled = false;
  for (const Call& c : calls) {
    const std::string op = c.op();
    if (op == "reset") {
      prefilled = false;
    } else if (op == "prefill") {
      if (prefilled) return false;
      prefilled = true;
      const json& ids = c.request["ids"];
      for (const json& r : ids)
        if (r.size() != ids[0].size()) return false;
    } else if (op == "step") {
      if (!prefilled || c.request.contains("rows")) return false;
    } else if (op != "threads") {
      return false;
    }
  }
  return true;
}

// A `generate` request's sequences as sent (docs/protocol.md). std::invalid_argument where our model
// would not take them: no requests, an empty prompt or one longer than the window, ids outside the
// vocabulary, a request waiting on one the call does not hold, a sequence that outgrows the window
// without `keep`.
std::vector<ServedRequest> generate_requests(const json& q, int64_t V, int64_t ctx) {
  std::vector<ServedRequest> out;
  std::set<int64_t> ids;
  const json& rs = q.at("requests");
  if (!rs.is_array() || rs.empty()) throw std::invalid_argument("a generate of no requests");
  for (const json& r : rs) {
    ServedRequest x;
    x.id = r.at("id").get<int64_t>();
    x.prompt = r.at("ids").get<std::vector<int64_t>>();
    x.n = r.at("n").get<int64_t>();
    x.after = r.value("after", int64_t{0});
    x.after_finished = r.value("after_finished", std::vector<int64_t>{});
    x.copies = r.value("copies", int64_t{1});
    x.keep = r.value("keep", int64_t{-1});
    const int64_t T0 = static_cast<int64_t>(x.prompt.size());
    if (T0 < 1 || T0 > ctx || x.n < 1 || x.copies < 1) throw std::invalid_argument("a generate request of no tokens, too many, or no copies");
    if (x.keep < 0 && T0 + x.n - 1 > ctx) throw std::invalid_argument("a generate request past the window without keep");
    for (int64_t id : x.prompt)
      if (id < 0 || id >= V) throw std::invalid_argument("an id outside the vocabulary");
    if (!ids.insert(x.id).second) throw std::invalid_argument("two generate requests of one id");
    out.push_back(std::move(x));
  }
  for (const ServedRequest& x : out)
    for (int64_t f : x.after_finished)
      if (!ids.count(f)) throw std::invalid_argument("a generate request waiting on one the call does not hold");
  return out;
}

// How many of a sequence's ids a replay judges: all of them, or for a request that may shift its
// context, those chosen while the sequence still fits the window (the engine decides how to shift).
int64_t judged_ids(const ServedRequest& x, int64_t ctx) {
  return x.keep < 0 ? x.n : std::min<int64_t>(x.n, ctx - static_cast<int64_t>(x.prompt.size()) + 1);
}

// Our model's answers: a ModelTarget of the series' cache, driven by the same calls.
class Oracle {
 public:
  // `variant`: the cache (and model) that answers: the series' cache, or a fault of the catalogue.
  // `batch`: the calls are one batch after each reset (batch_path()), answered through the target's own
  // prefill and step - the decode path a policy's fault is planted in - instead of its rows.
  Oracle(GPT model, int protocol, const CacheVariant& variant = cache_registry().get(kSeriesCache), bool batch = false)
      : model_(model), variant_(&variant), target_(model, variant), protocol_(protocol), batch_(batch) {}

  // Our model's answer to `c`: the logits (R, V) of a prefill, step or extend, undefined otherwise.
  // Throws when the request is not one our model takes (a candidate that dropped what it needs).
  at::Tensor answer(const Call& c) {
    const std::string op = c.op();
    const json& q = c.request;
    const int64_t V = model_->config().vocab_size, ctx = model_->config().context;
    auto ids_ok = [&](const std::vector<int64_t>& ids) {
      for (int64_t id : ids)
        if (id < 0 || id >= V) throw std::invalid_argument("an id outside the vocabulary");
    };
    if (op == "reset") {
      target_.reset();
      ids_.clear(), live_.clear();
      return {};
    }
    if (op == "threads") return {};
    if (op == "generate") return generate(q);
    if (batch_ && op == "prefill") {  // (B, T) -> (B, V)
      const auto prompts = id_lists(q.at("ids"));
      for (const auto& p : prompts) ids_ok(p);
      target_.reset();
      std::vector<int64_t> flat;
      for (const auto& p : prompts) flat.insert(flat.end(), p.begin(), p.end());
      return target_.prefill(at::tensor(flat, at::kLong).view({static_cast<int64_t>(prompts.size()), -1}));
    }
    if (batch_ && op == "step") {  // (B, 1) -> (B, V)
      const auto ids = id_lists(q.at("ids"));
      std::vector<int64_t> flat;
      for (const auto& r : ids) {
        if (r.size() != 1) throw std::invalid_argument("a step of more than one id per row");
        ids_ok(r);
        flat.push_back(r[0]);
      }
      return target_.step(at::tensor(flat, at::kLong).view({-1, 1}));
    }
    if (op == "prefill") {
      const auto prompts = id_lists(q.at("ids"));
      if (prompts.empty()) throw std::invalid_argument("a prefill of no rows");
      for (const auto& p : prompts) {
        if (p.empty() || static_cast<int64_t>(p.size()) > ctx) throw std::invalid_argument("a prompt of 0 or more than context tokens");
        if (protocol_ < 2 && p.size() != prompts[0].size()) throw std::invalid_argument("protocol 1 rows of unequal lengths");
        ids_ok(p);
      }
      if (protocol_ < 2) target_.reset(), ids_.clear(), live_.clear();
      at::Tensor logits;
      const std::vector<int64_t> rows = target_.add_rows(prompts, logits);
      for (size_t i = 0; i < rows.size(); ++i) ids_[c.creates.at(i)] = rows[i], live_.push_back(c.creates[i]);
      return logits;  // (R, V)
    }
    if (op == "step") {
      const std::vector<std::string> hs = c.stepped();
      const auto ids = id_lists(q.at("ids"));
      if (hs.empty() || ids.size() != hs.size()) throw std::invalid_argument("a step whose ids are not one per row");
      // A step that names no rows steps every live one: a candidate that left another row live (a reset
      // dropped) steps rows the recorded one did not.
      if (!q.contains("rows") && std::set<std::string>(hs.begin(), hs.end()) != std::set<std::string>(live_.begin(), live_.end()))
        throw std::invalid_argument("a step of every row, where the live rows are not the ones it stepped");
      std::vector<int64_t> rows, flat;
      for (size_t i = 0; i < hs.size(); ++i) {
        if (ids[i].size() != 1) throw std::invalid_argument("a step of more than one id per row");
        ids_ok(ids[i]);
        rows.push_back(id(hs[i])), flat.push_back(ids[i][0]);
      }
      return target_.step_rows(rows, flat);  // (R, V)
    }
    if (op == "restore") {
      const auto it = states_.find(q.at("state").get<std::string>());
      if (it == states_.end()) throw std::invalid_argument("a restore of a state never saved");
      ids_[c.creates.at(0)] = target_.restore_row(it->second);
      live_.push_back(c.creates[0]);
      return {};
    }
    const int64_t row = id(q.at("row").get<std::string>());
    if (op == "extend") {
      const std::vector<int64_t> ids = q.at("ids").get<std::vector<int64_t>>();
      if (ids.empty()) throw std::invalid_argument("an extend of no ids");
      ids_ok(ids);
      return target_.extend_row(row, ids).unsqueeze(0);  // (1, V)
    }
    if (op == "fork") {
      ids_[c.creates.at(0)] = target_.fork_row(row);
      live_.push_back(c.creates[0]);
    } else if (op == "truncate") {
      target_.truncate_row(row, q.at("n").get<int64_t>());
    } else if (op == "release") {
      target_.release_row(row);
      live_.erase(std::remove(live_.begin(), live_.end(), q["row"].get<std::string>()), live_.end());
      ids_.erase(q["row"].get<std::string>());
    } else if (op == "save") {
      states_[c.saves] = target_.save_row(row);
    } else if (op == "shift") {
      target_.shift_row(row, q.at("keep").get<int64_t>(), q.at("discard").get<int64_t>());
    } else {
      throw std::invalid_argument("an operation a reproduction does not replay: " + op);
    }
    return {};
  }

 private:
  // Each sequence of a generate (requests in order, copies in order) decoded alone and greedily on a
  // cache of its own: what each id it judges was chosen from, (S, n, V), NaN past what is judged.
  at::Tensor generate(const json& q) {
    const int64_t V = model_->config().vocab_size, ctx = model_->config().context;
    const std::vector<ServedRequest> rs = generate_requests(q, V, ctx);
    int64_t n_max = 1, S = 0;
    for (const ServedRequest& x : rs) n_max = std::max(n_max, judged_ids(x, ctx)), S += x.copies;
    at::Tensor out = at::full({S, n_max, V}, std::numeric_limits<float>::quiet_NaN());
    int64_t s = 0;
    for (const ServedRequest& x : rs) {
      ModelTarget alone(model_, *variant_);
      alone.reset();
      at::Tensor next = alone.prefill(at::tensor(x.prompt, at::kLong).unsqueeze(0));  // (1, V)
      const int64_t m = judged_ids(x, ctx);
      at::Tensor seq = at::empty({m, V});
      for (int64_t i = 0; i < m; ++i) {
        seq[i].copy_(next[0].to(at::kFloat));
        if (i + 1 < m) next = alone.step(next.argmax(-1).view({1, 1}));
      }
      for (int64_t k = 0; k < x.copies; ++k, ++s) out[s].narrow(0, 0, m).copy_(seq);
    }
    return out;  // (S, n_max, V)
  }

  int64_t id(const std::string& h) const {
    const auto it = ids_.find(h);
    if (it == ids_.end()) throw std::invalid_argument("a request naming row " + h + ", which is not live");
    return it->second;
  }
  GPT model_;
  const CacheVariant* variant_;
  ModelTarget target_;
  int protocol_;
  bool batch_;
  std::map<std::string, int64_t> ids_;
  std::map<std::string, std::string> states_;
  std::vector<std::string> live_;
};

// The first wrong answer of a replay, or none.
struct Wrong {
  size_t index = 0;
  std::string op, kind;  // kind: "differs" (logits off by more than the bound), "refused", "malformed", "stopped"
  double diff = 0;       // differs: the largest |engine - ours|
  int64_t row = 0, id = 0;
  double got = 0, want = 0;
  std::string text;  // refused: the engine's error; malformed, stopped: what was wrong
  at::Tensor answer;  // differs: the engine's logits there (R, V)
  bool same_as(const Wrong& o) const { return op == o.op && kind == o.kind; }
};

struct Replay {
  bool valid = true;  // our model answered every request
  std::optional<Wrong> wrong;
  std::vector<at::Tensor> expected;  // our answer per call (undefined: no logits)
};

// A generate's sequences against ours (`expected`, (S, n, V) with NaN past what is judged): each id our
// greedy choice, or one whose logit is within twice the bound of it (a near tie, either side off by the
// bound: from there the sequences part and the rest of it is not judged). The first id over that, as a
// "differs" Wrong (row: the sequence, id: the id's index, got/want: the ids, diff: our margin), or
// nullopt. `chose(s, i)`: the id sequence s chose at i.
std::optional<Wrong> generate_ids_wrong(const std::vector<ServedRequest>& rs, const at::Tensor& expected, double bound,
                                        const std::function<int64_t(int64_t, int64_t)>& chose, int64_t ctx) {
  int64_t s = 0;
  for (const ServedRequest& x : rs)
    for (int64_t k = 0; k < x.copies; ++k, ++s)
      for (int64_t i = 0; i < judged_ids(x, ctx); ++i) {
        const at::Tensor row = expected[s][i];
        const int64_t want = row.argmax().item<int64_t>(), got = chose(s, i);
        if (got == want) continue;
        const double margin = (row[want] - row[got]).item<double>();
        if (margin <= 2 * bound) break;  // a near tie: either may be chosen, and the sequences part here
        Wrong w;
        w.op = "generate", w.kind = "differs", w.diff = margin, w.row = s, w.id = i, w.got = static_cast<double>(got),
        w.want = static_cast<double>(want);
        w.text = "request " + std::to_string(x.id) + (x.copies > 1 ? " copy " + std::to_string(k) : std::string()) + " chose id " +
                 std::to_string(got) + " as its id " + std::to_string(i) + " (position " + std::to_string(x.prompt.size() + i) +
                 ") where the reference chooses " + std::to_string(want) + ", whose logit is " + sci(margin) +
                 " above the chosen one's (more than twice the bound " + sci(bound) + ")";
        return w;
      }
  return std::nullopt;
}

// The answers of our model through `variant` (the series' cache by default) to `calls`: the logits of
// each prefill, step and extend, undefined for the rest; nullopt when it refuses one.
std::optional<std::vector<at::Tensor>> our_answers(const Calls& calls, GPT& model, int protocol,
                                                   const CacheVariant& variant = cache_registry().get(kSeriesCache)) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  try {
    Oracle oracle(model, protocol, variant, batch_path(calls));
    for (const Call& c : calls) out.push_back(oracle.answer(c));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return out;
}

// Our model's answers to `calls` (invalid when it refuses one), then the engine's, up to its first
// wrong one. The engine is reset first. EngineUnusable from the engine comes back as a "stopped" wrong
// answer; the caller starts another engine.
Replay replay(const Calls& calls, GPT& model, int protocol, ReplayEngine& engine, double bound) {
  Replay r;
  std::optional<std::vector<at::Tensor>> ours = our_answers(calls, model, protocol);
  if (!ours) {
    r.valid = false;
    return r;
  }
  r.expected = std::move(*ours);
  std::map<std::string, json> rows, states;
  const int64_t V = model->config().vocab_size;
  auto wrong = [&](size_t i, const std::string& kind, const std::string& text) {
    Wrong w;
    w.index = i, w.op = calls[i].op(), w.kind = kind, w.text = text;
    r.wrong = w;
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const Call& c = calls[i];
    json q = c.request;
    try {
      if (q.contains("row") && q["row"].is_string()) q["row"] = rows.at(q["row"].get<std::string>());
      if (q.contains("rows"))
        for (json& h : q["rows"]) h = rows.at(h.get<std::string>());
      if (c.op() == "restore") q["state"] = states.at(q["state"].get<std::string>());
    } catch (const std::out_of_range&) {  // a row or state the engine's earlier answers never gave
      wrong(i, "malformed", "an earlier answer gave no id for a row or state this request names");
      return r;
    }
    json a;
    try {
      a = engine.call(q);
    } catch (const EngineUnusable& e) {
      wrong(i, "stopped", e.what());
      return r;
    }
    if (!a.value("ok", false)) {
      wrong(i, "refused", a.contains("error") && a["error"].is_string() ? engine_text(a["error"].get<std::string>()) : "");
      return r;
    }
    try {
      if (c.op() == "generate") {  // the sequences it was asked for, each of n ids; the ids judged against ours
        const std::vector<ServedRequest> rs = generate_requests(q, V, model->config().context);
        const std::vector<ServedResult> got = answer_served(a, rs, V);  // every sequence asked for, n ids each (else throws)
        std::map<std::pair<int64_t, int64_t>, const ServedResult*> by;
        for (const ServedResult& x : got) by[{x.id, x.copy}] = &x;
        std::vector<const ServedResult*> in_order;  // requests in order, copies in order: the rows of ours
        for (const ServedRequest& x : rs)
          for (int64_t k = 0; k < x.copies; ++k) in_order.push_back(by.at({x.id, k}));
        const auto chose = [&](int64_t seq, int64_t at) { return in_order[static_cast<size_t>(seq)]->ids[static_cast<size_t>(at)]; };
        if (std::optional<Wrong> w = generate_ids_wrong(rs, r.expected[i], bound, chose, model->config().context)) {
          w->index = i;
          r.wrong = w;
          return r;
        }
        continue;
      }
      if (r.expected[i].defined()) {
        const at::Tensor got = answer_logits(a, r.expected[i].size(0), V, c.op());  // (R, V)
        const at::Tensor d = (got - r.expected[i]).abs();
        const double worst = d.max().item<double>();
        if (!(worst <= bound)) {
          const int64_t at_flat = d.flatten().argmax().item<int64_t>();
          Wrong w;
          w.index = i, w.op = c.op(), w.kind = "differs", w.diff = worst, w.row = at_flat / V, w.id = at_flat % V;
          w.got = got[w.row][w.id].item<double>(), w.want = r.expected[i][w.row][w.id].item<double>();
          w.answer = got;
          r.wrong = w;
          return r;
        }
      }
      if (c.op() == "prefill" && protocol >= 2) {
        const std::vector<int64_t> made = answer_rows(a, c.creates.size());
        for (size_t k = 0; k < made.size(); ++k) rows[c.creates[k]] = made[k];
      }
      if (c.op() == "fork" || c.op() == "restore") rows[c.creates.at(0)] = answer_row(a, c.op());
      if (c.op() == "save") states[c.saves] = answer_state(a);
    } catch (const WrongAnswer& e) {
      wrong(i, "malformed", e.what());
      return r;
    }
  }
  return r;
}

// A fault of the catalogue that answers `calls` first wrongly where the engine did, the same way.
struct Match {
  const CacheVariant* fault;
  double diff;      // its |diff| from our production answer at its first wrong answer (0: a refusal)
  double distance;  // there, its largest |diff| from the engine's own answer (infinite where the engine was right)
  size_t first = 0;  // its first wrong answer
  std::string kind;
};

// How close a fault's wrong answer must come to the engine's to be the same bug: within half the
// engine's distance from the right answer (a twin gives the engine's answer up to float noise; another
// bug that fails at the same request gives another wrong answer).
constexpr double kSameAnswer = 0.5;

// Where fault `f`, sent `calls`, first answers otherwise than our `expected`: logits off by more than
// `bound` ("differs", with its answer there) or a refusal ("refused"); nullopt when it answers every one
// alike. Throws std::logic_error when f's cache cannot take the calls' operations at all (rows, save or
// shift not offered).
struct FaultWrong {
  size_t index = 0;
  std::string kind;
  double diff = 0;    // differs: its |diff| from ours there
  at::Tensor answer;  // differs: its logits there (R, V)
  int64_t seq = -1, at = -1, chose = -1;  // differs in a generate: the sequence, the id's index, the id it chose
};
std::optional<FaultWrong> fault_first_wrong(const Calls& calls, const std::vector<at::Tensor>& expected, GPT& model, int protocol,
                                            const CacheVariant& f, double bound) {
  at::NoGradGuard no_grad;
  Oracle o(model, protocol, f, batch_path(calls));
  for (size_t i = 0; i < calls.size(); ++i) {
    at::Tensor got;
    try {
      got = o.answer(calls[i]);
    } catch (const std::logic_error&) {
      throw;
    } catch (const std::exception&) {
      return FaultWrong{i, "refused", 0, {}};
    }
    if (got.defined() && expected[i].defined() && calls[i].op() == "generate") {  // its own greedy ids against ours
      const int64_t ctx = model->config().context;
      const std::vector<ServedRequest> rs = generate_requests(calls[i].request, model->config().vocab_size, ctx);
      const auto chose = [&](int64_t seq, int64_t at) { return got[seq][at].argmax().item<int64_t>(); };
      if (const std::optional<Wrong> w = generate_ids_wrong(rs, expected[i], bound, chose, ctx))
        return FaultWrong{i, "differs", w->diff, {}, w->row, w->id, static_cast<int64_t>(w->got)};
    } else if (got.defined() && expected[i].defined()) {
      const double diff = (got - expected[i]).abs().max().item<double>();
      if (!(diff <= bound)) return FaultWrong{i, "differs", diff, got};
    }
  }
  return std::nullopt;
}

// The catalogue's faults (FaultUse::Diagnosis) sent `calls`: those whose first answer off by more than
// `bound` from ours (`expected`), or first refusal, is at the engine's wrong request and of its kind, and
// whose wrong logits there are the engine's (within kSameAnswer of its |diff|), the nearest first. A fault
// whose cache cannot take the calls' operations (a std::logic_error: rows, save or shift not offered) is
// not one of them.
std::vector<Match> catalogue_matches(const Calls& calls, const std::vector<at::Tensor>& expected, const Wrong& w, GPT& model,
                                     int protocol, double bound) {
  std::vector<Match> out;
  if (w.kind != "differs" && w.kind != "refused") return out;
  at::NoGradGuard no_grad;
  constexpr double far = std::numeric_limits<double>::infinity();
  for (const CacheVariant* f : faults_for(model->config(), FaultUse::Diagnosis).faults) {
    std::optional<FaultWrong> fw;
    try {
      fw = fault_first_wrong(calls, expected, model, protocol, *f, bound);
    } catch (const std::logic_error&) {
      continue;
    }
    if (!fw || fw->index > w.index || fw->kind != w.kind) continue;
    double distance = far;  // from the engine's answer, at the engine's wrong request
    if (fw->index == w.index && fw->kind == "refused") distance = 0;
    if (fw->index == w.index && fw->kind == "differs" && w.answer.defined() && w.answer.sizes() == fw->answer.sizes())
      distance = (fw->answer - w.answer).abs().max().item<double>();
    if (fw->index == w.index && w.op == "generate" && fw->seq == w.row && fw->at == w.id && fw->chose == static_cast<int64_t>(w.got))
      distance = 0;  // the same id chosen wrongly in the same place
    out.push_back({f, fw->diff, distance, fw->index, fw->kind});
  }
  std::stable_sort(out.begin(), out.end(), [](const Match& a, const Match& b) { return a.distance < b.distance; });
  return out;
}

// `calls` without the rows `drop` and everything made from them: their prompts, their ids in steps, the
// requests naming them, their forks and the rows restored from their states. Empty when the failing
// request goes with them.
Calls calls_without_rows(const Calls& best_, const std::set<std::string>& drop) {
  std::set<std::string> gone = drop, states;
  Calls c;
  for (size_t i = 0; i < best_.size(); ++i) {
    const Call& x = best_[i];
    Call y = x;
    const std::string op = x.op();
    const bool names_gone = x.request.contains("row") && x.request["row"].is_string() && gone.count(x.request["row"].get<std::string>());
    const bool last = i + 1 == best_.size();
    bool keep = true;
    if (op == "fork" && names_gone) gone.insert(x.creates[0]), keep = false;
    else if (op == "save" && names_gone) states.insert(x.saves), keep = false;
    else if (op == "restore" && states.count(x.request["state"].get<std::string>())) gone.insert(x.creates[0]), keep = false;
    else if (names_gone) keep = false;
    else if (op == "prefill" || op == "step") {
      const std::vector<std::string> hs = op == "prefill" ? x.creates : x.stepped();
      json ids = json::array(), rows = json::array();
      std::vector<std::string> kept;
      for (size_t r = 0; r < hs.size(); ++r)
        if (!gone.count(hs[r])) ids.push_back(x.request["ids"][r]), rows.push_back(hs[r]), kept.push_back(hs[r]);
      keep = !kept.empty();
      y.request["ids"] = ids;
      if (op == "prefill") y.creates = kept;
      else if (x.request.contains("rows")) y.request["rows"] = rows;
      else y.covers = kept;
    }
    if (!keep && last) return {};
    if (keep) c.push_back(std::move(y));
  }
  return c;
}

// True when fault `f` answers every request of `calls` as our production cache does (to within
// `bound`, refusing none it takes); false too when our model refuses one, or `f` cannot take them.
bool fault_right_on(const Calls& calls, GPT& model, int protocol, const CacheVariant& f, double bound) {
  const std::optional<std::vector<at::Tensor>> ours = our_answers(calls, model, protocol);
  if (!ours) return false;
  try {
    return !fault_first_wrong(calls, *ours, model, protocol, f, bound);
  } catch (const std::logic_error&) {
    return false;
  }
}

// What the catalogue says of a failing sequence: the faults named (the likeliest first) and the sentence.
struct SequenceDiagnosis {
  std::vector<std::string> matches;
  std::string text;
};

SequenceDiagnosis diagnose_calls(const Calls& best, const std::vector<at::Tensor>& expected, const Wrong& w, GPT& model, int protocol,
                                 double bound) {
  SequenceDiagnosis out;
  const std::vector<Match> all_wrong = catalogue_matches(best, expected, w, model, protocol, bound);
  // First the faults that answer as the engine does at its wrong request. Where none does and that
  // request is a step, the faults that fail these requests first among the steps after the operation
  // the engine's failure followed (a fork, a release and admit, a truncate...): the same bug in storage
  // that shows at another step (a shared list at the parent's next step, a shared buffer once a write
  // lands in it). Both need every answer before right, as the engine's were.
  std::vector<Match> m;
  std::vector<std::string> others;  // wrong at the same request, with answers of their own
  for (const Match& x : all_wrong)
    if (x.first == w.index && (w.kind == "refused" || x.distance <= kSameAnswer * w.diff)) m.push_back(x);
  std::string after_op;
  if (m.empty() && w.op == "step") {
    size_t op_at = 0;
    for (size_t i = 0; i < w.index; ++i)
      if (best[i].op() != "step" && best[i].op() != "reset" && best[i].op() != "threads") op_at = i;
    if (op_at > 0 && best[op_at].op() != "prefill") {
      after_op = best[op_at].op();
      // The same requests without that operation (and the rows it made): a fault it is the cause of
      // answers them right; one that fails without it (a mask, a position) is another bug.
      Calls without = best;
      without.erase(without.begin() + static_cast<std::ptrdiff_t>(op_at));
      if (!best[op_at].creates.empty())
        without = calls_without_rows(without, std::set<std::string>(best[op_at].creates.begin(), best[op_at].creates.end()));
      for (const Match& x : all_wrong)
        if (x.first > op_at && !without.empty() && fault_right_on(without, model, protocol, *x.fault, bound)) m.push_back(x);
      std::stable_sort(m.begin(), m.end(), [&](const Match& a, const Match& b) { return w.index - a.first < w.index - b.first; });
    }
  }
  for (const Match& x : all_wrong)
    if (x.first == w.index && std::none_of(m.begin(), m.end(), [&](const Match& y) { return y.fault == x.fault; })) {
      char b[64];
      std::snprintf(b, sizeof b, " (%.2g of the engine's distance)", x.distance / w.diff);
      others.push_back(x.fault->name + b);
    }
  for (const Match& x : m) out.matches.push_back(x.fault->name);
  if (m.empty()) {
    out.text = "no fault of our catalogue answers these requests as the engine does: no known fault" +
                    (others.empty() ? std::string()
                                    : std::string(" (wrong at the same request, with answers of their own: ") + results::join(others) + ")");
  } else {
    const CacheVariant& f = *m[0].fault;
    out.text = "our planted fault " + f.name + " (" + f.description + ") " +
                    (!after_op.empty() ? "fails these requests after the same " + after_op + " (first at request " + std::to_string(m[0].first + 1) +
                                             ", the engine's at " + std::to_string(w.index + 1) + ")"
                     : m[0].diff > 0   ? "answers these requests as the engine does (at request " + std::to_string(w.index + 1) + " within " +
                                           sci(m[0].distance) + " of the engine's answer, " + sci(w.diff) + " from the right one)"
                                       : "refuses request " + std::to_string(w.index + 1) + " as the engine does") +
                    (m.size() > 1 ? "; so do " + results::join(std::vector<std::string>(out.matches.begin() + 1, out.matches.end())) : std::string()) +
                    (f.remedy.empty() ? std::string() : ". " + f.remedy);
  }
  return out;
}

// What each call does, in words and positions: "step row @0 (id 17) at position 256".
std::vector<std::string> describe(const Calls& calls, int protocol) {
  std::vector<std::string> out;
  std::map<std::string, int64_t> pos;
  std::map<std::string, int64_t> saved;
  auto count = [](size_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  for (const Call& c : calls) {
    const std::string op = c.op();
    const json& q = c.request;
    std::ostringstream s;
    if (op == "reset") {
      pos.clear();
      s << "reset";
    } else if (op == "threads") {
      s << "threads " << q.value("n", 0);
    } else if (op == "generate") {
      s << "generate " << count(q["requests"].size(), "request") << ":";
      bool first = true;
      for (const json& r : q["requests"]) {
        s << (first ? " " : "; ") << r.value("id", int64_t{0}) << " (" << r["ids"].size() << "-token prompt, "
          << r.value("n", int64_t{0}) << " ids";
        if (r.value("copies", int64_t{1}) > 1) s << ", " << r.value("copies", int64_t{1}) << " copies";
        if (r.value("after", int64_t{0}) > 0) s << ", after " << r.value("after", int64_t{0}) << " tokens";
        if (r.contains("after_finished") && !r["after_finished"].empty()) s << ", after request " << r["after_finished"][0] << " finished";
        if (r.contains("keep")) s << ", keep " << r["keep"];
        s << ")";
        first = false;
      }
    } else if (op == "prefill") {
      if (protocol < 2) pos.clear();
      s << "prefill " << count(q["ids"].size(), "row") << ":";
      for (size_t i = 0; i < q["ids"].size(); ++i) {
        const int64_t n = static_cast<int64_t>(q["ids"][i].size());
        pos[c.creates[i]] = n;
        s << (i ? "," : "") << " " << c.creates[i] << " " << count(static_cast<size_t>(n), "token") << " (positions 0-" << n - 1 << ")";
      }
    } else if (op == "step") {
      const auto hs = c.stepped();
      s << "step";
      for (size_t i = 0; i < hs.size(); ++i)
        s << (i ? "," : "") << " row " << hs[i] << " id " << q["ids"][i][0].get<int64_t>() << " at position " << pos[hs[i]]++;
    } else if (op == "restore") {
      pos[c.creates[0]] = saved[q["state"].get<std::string>()];
      s << "restore " << q["state"].get<std::string>() << " as row " << c.creates[0] << " (" << count(static_cast<size_t>(pos[c.creates[0]]), "token") << ")";
    } else {
      const std::string row = q["row"].get<std::string>();
      if (op == "extend") {
        const int64_t n = static_cast<int64_t>(q["ids"].size());
        s << "extend row " << row << " by " << count(static_cast<size_t>(n), "token") << " (positions " << pos[row] << "-" << pos[row] + n - 1 << ")";
        pos[row] += n;
      } else if (op == "fork") {
        pos[c.creates[0]] = pos[row];
        s << "fork row " << row << " (" << count(static_cast<size_t>(pos[row]), "token") << ") as row " << c.creates[0];
      } else if (op == "truncate") {
        pos[row] -= q["n"].get<int64_t>();
        s << "truncate row " << row << " by " << q["n"].get<int64_t>() << " (to " << count(static_cast<size_t>(pos[row]), "token") << ")";
      } else if (op == "release") {
        s << "release row " << row;
      } else if (op == "save") {
        saved[c.saves] = pos[row];
        s << "save row " << row << " (" << count(static_cast<size_t>(pos[row]), "token") << ") as " << c.saves;
      } else if (op == "shift") {
        const int64_t keep = q["keep"].get<int64_t>(), discard = q["discard"].get<int64_t>();
        s << "shift row " << row << ": keep " << keep << ", discard " << discard << " (from " << pos[row] << " to " << count(static_cast<size_t>(pos[row] - discard), "token") << ")";
        pos[row] -= discard;
      }
    }
    out.push_back(s.str());
  }
  return out;
}

std::string wrong_line(const Wrong& w, const std::vector<std::string>& says, double bound) {
  const std::string where = "request " + std::to_string(w.index + 1) + " (" + says.at(w.index) + ")";
  char b[200];
  if (w.kind == "differs" && w.op == "generate") return "the answer to " + where + " is wrong: " + w.text;
  if (w.kind == "differs") {
    std::snprintf(b, sizeof b, "logit %lld of answer row %lld is %.6g where the reference has %.6g: |diff| %s > %s",
                  static_cast<long long>(w.id), static_cast<long long>(w.row), w.got, w.want, sci(w.diff).c_str(), sci(bound).c_str());
    return "the answer to " + where + " is wrong: " + b;
  }
  if (w.kind == "refused") return where + " was refused (\"" + w.text + "\"), where the reference takes it";
  if (w.kind == "stopped") return "the engine stopped answering at " + where + " (" + w.text + ")";
  return "the answer to " + where + " is malformed: " + w.text;
}

// `c` with the row that call i makes (a fork's, or a restore's of a state saved of a row) replaced by
// the row it was made from, where that row is used nowhere else from the save or fork on (a release
// of it goes too): the fork, or the save and the restore, dropped and the made row's calls on its
// source. nullopt where the source is used again.
std::optional<Calls> collapsed(const Calls& c, size_t i) {
  const Call& x = c[i];
  if ((x.op() != "fork" && x.op() != "restore") || x.creates.size() != 1) return std::nullopt;
  const std::string made = x.creates[0];
  std::string from;
  size_t since = i;  // the source must be unused from here on
  std::set<size_t> drop = {i};
  if (x.op() == "fork") {
    from = x.request["row"].get<std::string>();
  } else {
    const std::string state = x.request["state"].get<std::string>();
    size_t restores = 0;
    for (size_t k = 0; k < c.size(); ++k) {
      if (c[k].saves == state) from = c[k].request["row"].get<std::string>(), since = k;
      if (c[k].op() == "restore" && c[k].request["state"] == state) ++restores;
    }
    if (from.empty()) return std::nullopt;
    if (restores == 1) drop.insert(since);
  }
  auto names = [](const Call& y, const std::string& h) {
    if (y.request.contains("row") && y.request["row"] == h) return true;
    const std::vector<std::string> hs = y.op() == "step" ? y.stepped() : std::vector<std::string>{};
    return std::find(hs.begin(), hs.end(), h) != hs.end();
  };
  for (size_t k = since + 1; k < c.size(); ++k) {
    if (c[k].op() == "reset") break;
    if (!names(c[k], from) || drop.count(k)) continue;
    if (c[k].op() != "release" || k < i) return std::nullopt;
    drop.insert(k);
  }
  if (drop.count(c.size() - 1)) return std::nullopt;
  auto re = [&](std::string& h) {
    if (h == made) h = from;
  };
  Calls out;
  for (size_t k = 0; k < c.size(); ++k) {
    if (drop.count(k)) continue;
    Call y = c[k];
    if (k > i) {
      for (auto& h : y.covers) re(h);
      if (y.request.contains("row") && y.request["row"].is_string()) {
        std::string h = y.request["row"].get<std::string>();
        re(h);
        y.request["row"] = h;
      }
      if (y.request.contains("rows"))
        for (json& r : y.request["rows"]) {
          std::string h = r.get<std::string>();
          re(h);
          r = h;
        }
    }
    out.push_back(std::move(y));
  }
  return out;
}

// The row whose answer is `w` (the last of `c`) and the rows it was made from (forked, restored from a
// state saved of), as handles; empty when the wrong answer names no row.
std::set<std::string> wrong_lineage(const Calls& c, const Wrong& w) {
  if (c.empty()) return {};
  const Call& last = c.back();
  const std::vector<std::string> answered = last.op() == "prefill" ? last.creates
                                            : last.op() == "step"  ? last.stepped()
                                                                   : std::vector<std::string>{};
  std::string row = last.request.contains("row") && last.request["row"].is_string() ? last.request["row"].get<std::string>() : "";
  if (w.kind == "differs" && w.row < static_cast<int64_t>(answered.size())) row = answered[static_cast<size_t>(w.row)];
  std::set<std::string> out;
  if (row.empty()) return out;
  std::map<std::string, std::string> parent, saved_from;
  for (const Call& x : c) {
    if (x.op() == "fork") parent[x.creates[0]] = x.request["row"].get<std::string>();
    if (x.op() == "save") saved_from[x.saves] = x.request["row"].get<std::string>();
    if (x.op() == "restore") parent[x.creates[0]] = saved_from[x.request["state"].get<std::string>()];
  }
  for (std::string h = row; !h.empty() && out.insert(h).second;) h = parent.count(h) ? parent[h] : "";
  return out;
}

// Delta debugging over calls, each candidate judged by replay(); keeps the shortest failing sequence.
class Shrinker {
 public:
  Shrinker(GPT& model, const ReproSetup& s, const ReplayEngineFactory& fresh, const std::function<void(const std::string&)>& say)
      : model_(model), s_(s), fresh_(fresh), say_(say), start_(std::chrono::steady_clock::now()) {}

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  bool out_of_time() const { return elapsed() > s_.budget_s; }
  int64_t candidates() const { return candidates_; }

  // Every candidate on an engine of its own from now on: for an engine whose reset leaves something
  // behind, so that what one candidate left does not decide the next.
  void fresh_each(const Calls& from) {
    fresh_each_ = true;
    best_ = from;
  }

  // One replay on the shared engine (a fresh one after one stopped, or for each with fresh_each).
  Replay run(const Calls& c) {
    if (!engine_ || fresh_each_) engine_ = fresh_();
    Replay r = replay(c, model_, s_.protocol, *engine_, s_.bound);
    if (r.wrong && r.wrong->kind == "stopped") engine_.reset();
    return r;
  }

  // The first replay: the failure to keep, and the calls up to it.
  std::optional<Wrong> start(const Calls& all) {
    Replay r = run(all);
    if (!r.valid || !r.wrong) return std::nullopt;
    target_ = *r.wrong;
    best_.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(r.wrong->index + 1));
    return target_;
  }

  const Calls& best() const { return best_; }
  // The sequence at the end of each pass before prompts were halved, in order: longer than best().
  const std::vector<Calls>& checkpoints() const { return checkpoints_; }
  const Wrong& target() const { return target_; }

  // Keeps `c` (cut after its first wrong answer) when it fails as the target did.
  bool keeps(const Calls& c) {
    if (c.size() >= best_.size() && !(c.size() == best_.size() && tokens(c) < tokens(best_))) return false;
    for (const std::string& op : s_.keep_ops)
      if (std::none_of(c.begin(), c.end(), [&](const Call& x) { return x.op() == op; })) return false;  // cheap first
    ++candidates_;
    Replay r = run(c);
    if (!r.valid) {
      --candidates_;  // our model refused it: no engine request was sent
      return false;
    }
    if (!r.wrong || !r.wrong->same_as(target_)) return false;
    const Calls cut(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(r.wrong->index + 1));
    if (!keeps_the_operations(cut, *r.wrong)) return false;
    best_ = cut;
    last_ = *r.wrong;
    if (elapsed() - said_ > 5) {
      said_ = elapsed();
      say_(s_.row + ": " + std::to_string(best_.size()) + " requests still fail (" + std::to_string(candidates_) + " tried, " +
           std::to_string(static_cast<int>(elapsed())) + " s)");
    }
    return true;
  }

  void shrink() {
    for (bool progress = true; progress && !out_of_time();) {
      const size_t before = best_.size();
      const int64_t toks = tokens(best_);
      // The cheapest wins first: whole rows (every later request gets cheaper), then the few requests
      // that are not steps (a save or fork between a prefill and its steps keeps them from folding).
      drop_rows();
      drop_non_steps();
      drop_generate_requests();
      collapse_rows();
      fold_steps();
      drop_chunks();
      checkpoints_.push_back(best_);
      shorten_prompts();
      progress = best_.size() < before || tokens(best_) < toks;
    }
  }

 private:
  // --repro-keep: each operation named acts on the wrong answer's row or a row it was made from (a
  // shift on another row beside it does not count).
  bool keeps_the_operations(const Calls& cut, const Wrong& w) const {
    if (s_.keep_ops.empty()) return true;
    const std::set<std::string> rows = wrong_lineage(cut, w);
    auto on_them = [&](const Call& x) {
      std::vector<std::string> hs = x.op() == "step" ? x.stepped() : x.creates;
      if (x.request.contains("row") && x.request["row"].is_string()) hs.push_back(x.request["row"].get<std::string>());
      return std::any_of(hs.begin(), hs.end(), [&](const std::string& h) { return rows.count(h) > 0; });
    };
    for (const std::string& op : s_.keep_ops)
      if (std::none_of(cut.begin(), cut.end(), [&](const Call& x) { return x.op() == op && on_them(x); })) return false;
    return true;
  }

  // The tokens a sequence has an engine read or write: its prompts, and a generate's prompts and ids.
  static int64_t tokens(const Calls& c) {
    int64_t n = 0;
    for (const Call& x : c) {
      if (x.op() == "prefill")
        for (const json& p : x.request["ids"]) n += static_cast<int64_t>(p.size());
      if (x.op() == "generate")
        for (const json& r : x.request["requests"])
          n += (static_cast<int64_t>(r["ids"].size()) + r.value("n", int64_t{0})) * r.value("copies", int64_t{1});
    }
    return n;
  }

  // A prefill followed by steps of exactly its rows: the steps' ids appended to the prompts instead
  // (as many as the window holds, then half as many, ...; after a fold that keeps the failure, as many
  // again: a failure past the window takes the prompt up to the window's edge, where folding every
  // step at once may fail otherwise - an engine refusing a prompt of the whole window, say).
  void fold_steps() {
    const int64_t ctx = model_->config().context;
    for (size_t i = 1; i < best_.size() && !out_of_time(); ++i) {
      if (best_[i].op() != "prefill") continue;
      auto foldable = [&] {  // the steps after the prefill that fit the window, never the failing request
        const Call& p = best_[i];
        int64_t longest = 0;
        for (const json& r : p.request["ids"]) longest = std::max<int64_t>(longest, static_cast<int64_t>(r.size()));
        size_t j = i + 1;
        while (j + 1 < best_.size() && best_[j].op() == "step" && best_[j].stepped() == p.creates &&
               longest + static_cast<int64_t>(j - i) <= ctx)
          ++j;
        return j - i - 1;
      };
      for (size_t n = foldable(); n >= 1 && !out_of_time();) {
        Calls c = best_;
        for (size_t k = 1; k <= n; ++k)
          for (size_t r = 0; r < c[i].creates.size(); ++r) c[i].request["ids"][r].push_back(best_[i + k].request["ids"][r][0]);
        c.erase(c.begin() + static_cast<std::ptrdiff_t>(i + 1), c.begin() + static_cast<std::ptrdiff_t>(i + 1 + n));
        n = keeps(c) ? std::min(n, foldable()) : n / 2;
      }
    }
  }

  // Each request of a generate dropped on its own (and every wait on it), last first.
  void drop_generate_requests() {
    for (size_t i = 0; i < best_.size() && !out_of_time(); ++i) {
      if (best_[i].op() != "generate") continue;
      for (size_t j = best_[i].request["requests"].size(); j-- > 0 && !out_of_time();) {
        if (i >= best_.size() || best_[i].op() != "generate" || best_[i].request["requests"].size() < 2) break;
        if (j >= best_[i].request["requests"].size()) continue;
        Calls c = best_;
        json& rs = c[i].request["requests"];
        const json gone = rs[j].value("id", json());
        rs.erase(rs.begin() + static_cast<std::ptrdiff_t>(j));
        for (json& r : rs)
          if (r.contains("after_finished")) {
            json& waits = r["after_finished"];
            waits.erase(std::remove(waits.begin(), waits.end(), gone), waits.end());
          }
        keeps(c);
      }
    }
  }

  // Each fork, and each restore of a state saved, undone where its source row goes unused (collapsed()):
  // a chain of rows made from rows becomes one row.
  void collapse_rows() {
    for (size_t i = best_.size(); i-- > 1 && !out_of_time();)
      if (i < best_.size())
        if (const auto c = collapsed(best_, i)) keeps(*c);
  }

  // Each request other than a step dropped on its own (never the first reset or the failing request).
  void drop_non_steps() {
    for (size_t i = best_.size() - 1; i-- > 1 && !out_of_time();) {
      if (i >= best_.size() - 1 || best_[i].op() == "step") continue;
      Calls c = best_;
      c.erase(c.begin() + static_cast<std::ptrdiff_t>(i));
      keeps(c);
    }
  }

  // Contiguous runs of requests dropped (never the first reset or the failing request), halving the run.
  void drop_chunks() {
    size_t chunk = std::max<size_t>(1, (best_.size() - 1) / 2);
    while (!out_of_time()) {
      bool dropped = false;
      for (size_t a = 1; a + 1 < best_.size() && !out_of_time();) {
        const size_t b = std::min(a + chunk, best_.size() - 1);
        Calls c = best_;
        c.erase(c.begin() + static_cast<std::ptrdiff_t>(a), c.begin() + static_cast<std::ptrdiff_t>(b));
        if (keeps(c)) dropped = true;
        else a = b;
      }
      if (!dropped) {
        if (chunk == 1) break;
        chunk /= 2;
      }
    }
  }

  Calls without_rows(const std::set<std::string>& drop) const { return calls_without_rows(best_, drop); }

  // Rows dropped by delta debugging over the rows: half of them at once, then quarters, ..., then one by one.
  void drop_rows() {
    auto made = [&] {
      std::vector<std::string> h;
      for (const Call& c : best_)
        for (const auto& x : c.creates) h.push_back(x);
      return h;
    };
    // First every row but the one whose answer was wrong and the rows it was made from (forked, restored).
    if (const std::vector<std::string> rows = made(); rows.size() > 1) {
      if (const std::set<std::string> keep = wrong_lineage(best_, target_); !keep.empty()) {
        std::set<std::string> drop;
        for (const auto& h : rows)
          if (!keep.count(h)) drop.insert(h);
        if (!drop.empty()) {
          const Calls c = without_rows(drop);
          if (c.size() > 1) keeps(c);
        }
      }
    }
    size_t chunk = std::max<size_t>(1, made().size() / 2);
    while (!out_of_time()) {
      bool dropped = false;
      for (size_t a = 0; !out_of_time();) {
        const std::vector<std::string> rows = made();
        if (a >= rows.size() || rows.size() < 2) break;
        const std::set<std::string> drop(rows.begin() + static_cast<std::ptrdiff_t>(a),
                                         rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), a + chunk)));
        const Calls c = without_rows(drop);
        if (c.size() > 1 && keeps(c)) dropped = true;
        else a += chunk;
      }
      if (!dropped) {
        if (chunk == 1) break;
        chunk /= 2;
      }
    }
  }

  // Each prompt's first half dropped, while the failure stays (protocol 1: every row's alike).
  void shorten_prompts() {
    for (size_t i = 1; i < best_.size() && !out_of_time(); ++i) {
      if (best_[i].op() != "prefill") continue;
      const size_t rows = best_[i].request["ids"].size();
      for (size_t r = 0; r < rows && !out_of_time(); ++r) {
        while (!out_of_time()) {
          Calls c = best_;
          bool any = false;
          for (size_t k = 0; k < rows; ++k) {
            if (s_.protocol >= 2 && k != r) continue;
            json& p = c[i].request["ids"][k];
            if (p.size() < 2) continue;
            const size_t drop = p.size() / 2;
            p.erase(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(drop));
            any = true;
          }
          if (!any || !keeps(c)) break;
        }
        if (s_.protocol < 2) break;
      }
    }
  }

  GPT& model_;
  const ReproSetup& s_;
  const ReplayEngineFactory& fresh_;
  std::function<void(const std::string&)> say_;
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<ReplayEngine> engine_;
  Calls best_;
  Wrong target_, last_;
  int64_t candidates_ = 0;
  double said_ = 0;
  bool fresh_each_ = false;
  std::vector<Calls> checkpoints_;
};

// A generate's expected sequences for repro.py: per sequence its request id, copy and n, and per id
// judged our choice and the ids within twice the bound of it ([id, our margin]: a near tie either way).
json generate_expect(const json& request, const at::Tensor& expected, double bound, GPT& model) {
  const int64_t ctx = model->config().context;
  json out = json::array();
  int64_t s = 0;
  for (const ServedRequest& x : generate_requests(request, model->config().vocab_size, ctx))
    for (int64_t k = 0; k < x.copies; ++k, ++s) {
      json ids = json::array(), near = json::array();
      for (int64_t i = 0; i < judged_ids(x, ctx); ++i) {
        const at::Tensor row = expected[s][i].to(at::kDouble);
        const int64_t want = row.argmax().item<int64_t>();
        const double top = row[want].item<double>();
        json ties = json::array();
        const at::Tensor close = (row >= top - 2 * bound).nonzero().flatten();
        for (int64_t j = 0; j < close.size(0); ++j) {
          const int64_t id = close[j].item<int64_t>();
          if (id != want) ties.push_back({id, top - row[id].item<double>()});
        }
        ids.push_back(want);
        near.push_back(ties);
      }
      out.push_back({{"id", x.id}, {"copy", k}, {"n", x.n}, {"ids", ids}, {"near", near}});
    }
  return out;
}

json tensor_rows(const at::Tensor& t) {  // (R, V) float -> [[...], ...]
  const at::Tensor c = t.to(at::kCPU).to(at::kFloat).contiguous();
  json out = json::array();
  for (int64_t r = 0; r < c.size(0); ++r) out.push_back(std::vector<float>(c[r].data_ptr<float>(), c[r].data_ptr<float>() + c.size(1)));
  return out;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d", std::gmtime(&now));
  return b;
}

std::string safe_name(const std::string& row) {
  std::string s;
  for (char ch : row) s += std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.' ? ch : '_';
  return s;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

std::string report_md(const ReproSetup& s, const Calls& calls, const std::vector<std::string>& says, const Wrong& w, const ReproResult& res,
                      const std::string& model_name) {
  const std::string engine = engine_text(s.hello.value("name", std::string("(unnamed)")), 120);
  std::ostringstream m;
  m << "# " << engine << ": `" << s.row << "` fails in " << calls.size() << " requests\n\n";
  m << "Sent the " << calls.size() << " requests below (after `hello` and `load` of `" << model_name << "`, this folder's model in the "
    << "engine's `" << s.load.value("format", std::string()) << "` format), " << wrong_line(w, says, s.bound)
    << ". Every earlier answer agreed with the reference to within " << sci(s.bound) << " (" << s.bound_why << "). The reference is "
    << "tinygpt-verify's model of the same weights (the series' GPT, docs/SPEC.md) decoding the same requests through its "
    << "reference cache, which `tinygpt verify` holds to the uncached forward pass; its answer to each request is stored beside "
    << "it in `requests.json`. Engine: " << engine << " (its hello: `" << engine_json(s.hello, 400) << "`). Found by tinygpt-verify "
    << "(commit " << git_commit() << ") on " << today() << ".\n\n";
  m << "## Reproduce\n\n```sh\npython3 repro.py                      # exit 1 while the failure is there, 0 once it is fixed\n"
    << "python3 repro.py --engine \"COMMAND\"  # the same requests to another build of the engine\n```\n\n"
    << "It needs Python 3 (its standard library only) and the engine. It starts `" << s.engine << "` through `/bin/sh -c`, "
    << "speaks the line protocol of docs/protocol.md (one JSON object per line on its stdin and stdout), loads `" << model_name
    << "`, sends the requests, compares every answer's logits with the stored ones, and prints the first difference. "
    << "Exit 2: the engine could not be started or loaded.\n\n";
  if (std::any_of(calls.begin(), calls.end(), [](const Call& c) { return c.op() == "generate"; }))
    m << "A `generate` (sequences the engine schedules itself) is judged by its ids: every sequence asked for comes back with its "
      << "`n` ids, each the reference's greedy choice over that sequence alone or one within twice the bound of it (a near tie, "
      << "after which that sequence is not judged further). Where a request may shift its context (`keep`), the ids chosen once "
      << "the sequence outgrows the window are counted, not judged: how far to shift is the engine's choice.\n\n";
  if (!s.export_command.empty()) m << "The model file is written again by `" << s.export_command << "`.\n\n";
  m << "## The requests\n\n";
  const size_t shown = std::min<size_t>(calls.size(), 60);
  for (size_t i = 0; i < shown; ++i) m << i + 1 << ". " << says[i] << (i == w.index ? "  <- the first wrong answer" : "") << "\n";
  if (shown < calls.size()) m << "\n(" << calls.size() - shown << " more in requests.json)\n";
  if (std::any_of(calls.begin(), calls.end(), [](const Call& c) { return !c.creates.empty(); }))
    m << "\nRows are named `@0`, `@1`, ... in the order the engine's answers made them; repro.py sends the ids the engine gave.\n";
  m << "\n";
  if (!res.diagnosis.empty()) m << "## What it looks like\n\n" << res.diagnosis << ".\n\n";
  m << "## How it was found\n\n";
  m << "The row `" << s.row << "` of `tinygpt conform` sent "
    << (s.after_row.empty() ? std::to_string(res.requests_before)
                            : std::to_string(res.requests_before - s.after_requests) + " requests after the " + std::to_string(s.after_requests) +
                                  " of the main run `" + s.after_row + "` sent, which its own do not fail without; the " +
                                  std::to_string(res.requests_before))
    << " requests. Delta debugging - dropping "
    << "requests and rows, folding steps into the prompt, shortening prompts - with the reference's answers recomputed for every "
    << "candidate, kept the same failure (the first wrong answer is to a `" << w.op << "`, " << (w.kind == "differs" ? (w.op == "generate" ? "another id chosen" : "off by more than " + sci(s.bound)) : w.kind)
    << ") in " << calls.size() << " requests: " << res.candidates << " candidates replayed, " << static_cast<int>(res.seconds + 0.5) << " s.\n";
  return m.str();
}

}  // namespace

const std::vector<std::string>& replayed_operations() {
  static const std::vector<std::string> ops = {"reset", "prefill", "step",    "extend", "fork",   "truncate",
                                               "release", "save", "restore", "shift", "threads", "generate"};
  return ops;
}

ReproResult reproduce(const Transcript& t, const ReproSetup& s, GPT& model, const ReplayEngineFactory& fresh,
                      const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& x) {
    if (progress) progress(x);
  };
  ReproResult res;
  res.row = s.row;
  res.requests_before = t.exchanges.size();
  const auto started = std::chrono::steady_clock::now();
  if (t.overflowed) {
    res.why_not = "it sent more than " + std::to_string(kTranscriptLimit) + " requests";
    return res;
  }
  Calls all;
  try {
    all = calls_of(t, s.protocol);
  } catch (const std::exception& e) {
    res.why_not = e.what();
    return res;
  }
  if (all.empty()) {
    res.why_not = "it sent the engine no request";
    return res;
  }
  if (all[0].op() != "reset") all.insert(all.begin(), Call{json{{"op", "reset"}}, {}, {}, {}});
  say(s.row + ": replaying its " + std::to_string(t.exchanges.size()) + " requests on a fresh engine");
  Shrinker sh(model, s, fresh, say);
  std::optional<Wrong> first;
  try {
    first = sh.start(all);
  } catch (const EngineUnusable& e) {
    res.why_not = std::string("a fresh engine could not be started: ") + e.what();
    return res;
  }
  if (!first) {
    res.right_alone = true;
    res.why_not = "replayed on a fresh engine, its requests were all answered within " + sci(s.bound) +
                  " of our model (the row's failure needs what a replay does not carry: another process, the sampler, "
                  "a comparison of the engine with itself, or the ids a generate chose after a context shift of its own)";
    return res;
  }
  auto confirmed = [&](const Calls& c, Replay& out) {
    try {
      std::unique_ptr<ReplayEngine> e = fresh();
      out = replay(c, model, s.protocol, *e, s.bound);
    } catch (const EngineUnusable&) {
      out = Replay{};
    }
    return out.valid && out.wrong && out.wrong->same_as(sh.target());
  };
  Replay confirm;
  bool ok = false;
  try {
    sh.shrink();
    // Confirmed on a fresh engine, as repro.py runs it. Where it is not (the engine's reset left
    // something behind that the sequence needed), shrunk again from the row's failing prefix with a
    // fresh engine for every candidate.
    ok = confirmed(sh.best(), confirm);
    if (!ok && !sh.out_of_time()) {
      say(s.row + ": the shrunk sequence passes on a fresh engine; shrinking again with a fresh engine for each candidate");
      Replay whole;
      if (confirmed(all, whole)) {
        sh.fresh_each(Calls(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(whole.wrong->index + 1)));
        sh.shrink();
        ok = confirmed(sh.best(), confirm);
      }
    }
  } catch (const EngineUnusable& e) {
    say(s.row + ": shrinking stopped: " + e.what());
  }
  Calls best = sh.best();
  if (!ok && confirmed(all, confirm)) best = all, ok = true;  // the row's own requests, unshrunk
  if (ok) best.resize(confirm.wrong->index + 1);
  else confirm.wrong.reset();
  if (!confirm.wrong) {
    res.why_not = "the failure did not repeat on a fresh engine (it depends on what earlier requests left behind)";
    return res;
  }
  best = renumbered(best);
  const Wrong& w = *confirm.wrong;
  const std::vector<std::string> says = describe(best, s.protocol);
  res.requests_after = best.size();
  res.candidates = sh.candidates();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  res.failure = wrong_line(w, says, s.bound);
  if (s.diagnose) {
    SequenceDiagnosis d = diagnose_calls(best, confirm.expected, w, model, s.protocol, s.bound);
    // None on the shortest sequence: the sequences shrinking passed through (before prompts were
    // halved, before runs were dropped, ...), the shortest first - a twin can need a bug's scale (16
    // entries left out of a saved state need more than one entry to save).
    // Several alike on it (a step at position 1 turned at 0 is both "rotated at 0" and "one early"): the
    // longer sequences keep those that match there too, until one is left.
    for (auto c = sh.checkpoints().rbegin(); d.matches.size() != 1 && c != sh.checkpoints().rend(); ++c) {
      if (const Calls same = renumbered(*c);
          same.size() == best.size() && std::equal(same.begin(), same.end(), best.begin(), [](const Call& x, const Call& y) { return x.request == y.request; }))
        continue;
      Replay r;
      try {
        std::unique_ptr<ReplayEngine> e = fresh();
        r = replay(*c, model, s.protocol, *e, s.bound);
      } catch (const EngineUnusable&) {
        continue;
      }
      if (!r.valid || !r.wrong || !r.wrong->same_as(w)) continue;
      const Calls cut(c->begin(), c->begin() + static_cast<std::ptrdiff_t>(r.wrong->index + 1));
      SequenceDiagnosis on = diagnose_calls(cut, r.expected, *r.wrong, model, s.protocol, s.bound);
      if (on.matches.empty()) continue;
      std::vector<std::string> both;
      for (const auto& f : on.matches)
        if (d.matches.empty() || std::count(d.matches.begin(), d.matches.end(), f)) both.push_back(f);
      if (both.empty()) continue;
      if (both.size() == on.matches.size()) d = {both, "on a longer sequence shrinking passed through (" + std::to_string(cut.size()) + " requests), " + on.text};
      else
        d = {both, "our planted fault " + both[0] + " answers these requests as the engine does, on the shortest sequence and on one " +
                       "shrinking passed through (" + std::to_string(cut.size()) + " requests)" +
                       (both.size() > 1 ? "" : ", where the others alike on the shortest answer otherwise")};
    }
    if (d.matches.size() > 1 && d.text.rfind("one of", 0) != 0) {
      // Still several: each answers the engine's requests alike; the diagnosis names them all.
      d.text = "one of " + results::join(d.matches) + " (alike on every sequence tried): " + d.text;
    }
    res.matches = d.matches;
    res.diagnosis = d.text;
    say(s.row + ": " + res.diagnosis);
  }

  // The bundle, written beside its final place and renamed there: never a half-written folder.
  const fs::path dir = fs::path(s.out_dir) / safe_name(s.row);
  const fs::path tmp = fs::path(s.out_dir) / ("." + safe_name(s.row) + ".partial");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const fs::path model_src(s.model_file);
  const std::string model_name = "model" + model_src.extension().string();
  fs::copy(model_src, tmp / model_name, fs::copy_options::recursive);
  json load = s.load;
  load["checkpoint"] = model_name;
  json steps = json::array();
  for (size_t i = 0; i < best.size(); ++i) {
    json st = {{"request", best[i].request}, {"says", says[i]}};
    if (!best[i].creates.empty()) st["creates"] = best[i].creates;
    if (!best[i].saves.empty()) st["saves"] = best[i].saves;
    if (confirm.expected[i].defined() && best[i].op() == "generate") st["expect"] = generate_expect(best[i].request, confirm.expected[i], s.bound, model);
    else if (confirm.expected[i].defined()) st["logits"] = tensor_rows(confirm.expected[i]);
    steps.push_back(std::move(st));
  }
  json failure = {{"request", w.index + 1}, {"op", w.op}, {"kind", w.kind}, {"says", res.failure}};
  if (w.kind == "differs") failure["diff"] = w.diff;
  const json doc = {{"format", "tinygpt-repro 1"},
                    {"row", s.row},
                    {"engine", s.engine},
                    {"protocol", kProtocol},
                    {"hello", s.hello},
                    {"load", load},
                    {"export", s.export_command},
                    {"bound", s.bound},
                    {"bound_why", s.bound_why},
                    {"failure", failure},
                    {"shrunk", {{"requests_before", res.requests_before}, {"requests_after", res.requests_after}, {"candidates", res.candidates}}},
                    {"steps", steps}};
  write_file(tmp / "requests.json", doc.dump(1) + "\n");
  write_file(tmp / "repro.py", repro_script());
  fs::permissions(tmp / "repro.py", fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::add);
  write_file(tmp / "REPORT.md", report_md(s, best, says, w, res, model_name));
  if (!res.matches.empty()) {
    std::ifstream in(tmp / "requests.json");
    json d = json::parse(in);
    d["matches"] = res.matches;
    write_file(tmp / "requests.json", d.dump(1) + "\n");
  }
  fs::remove_all(dir);
  fs::rename(tmp, dir);
  res.dir = dir.string();
  say(s.row + ": " + std::to_string(res.requests_before) + " requests -> " + std::to_string(res.requests_after) + " in " + res.dir);
  return res;
}

}  // namespace tinygpt::checks
