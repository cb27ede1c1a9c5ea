// A failing row handed upstream: the protocol requests one row sent an engine (its transcript), shrunk
// by delta debugging to a short sequence that still fails the same way, and written as a bundle that
// replays without tinygpt - the model in the engine's format, requests.json (each request with the
// answer our model gives it), repro.py (the Python standard library and the engine's command) and
// REPORT.md (the paragraph a maintainer reads first, then the steps). docs/protocol.md, "Reproductions".
//
// A candidate sequence is judged the way the row judged the engine: our model answers each request
// (a ModelTarget of the series' cache, driven through the same rows by id), and the candidate keeps
// the failure when the engine's first wrong answer is to the same operation, wrong in the same way
// (its logits off by more than the row's bound, or a refusal our model does not make).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tinygpt/gpt.h"

namespace tinygpt::checks {

// One request sent to an engine and what of its answer later requests name: the answer less its
// logits ("ok", "error", "rows", "row", "state", "reused").
struct Exchange {
  nlohmann::json request, answer;
};

// The requests of one row's run, in order; past kTranscriptLimit the rest are not kept.
struct Transcript {
  std::vector<Exchange> exchanges;
  bool overflowed = false;
};
inline constexpr size_t kTranscriptLimit = 50000;

// What a replay of one row needs besides its transcript.
struct ReproSetup {
  std::string row;          // the row that failed
  std::string engine;       // the engine's command line
  int protocol = 1;         // the protocol the engine answered in hello
  nlohmann::json hello;     // the engine's hello answer (name, versions, deviations)
  nlohmann::json load;      // the load request as sent (checkpoint: the file below)
  std::string model_file;   // the model in the engine's format, as the engine loaded it
  double bound = 1e-4;      // the row's max |diff|, the bound a kept failure exceeds
  std::string bound_why;    // where the bound comes from ("the default", "declared gelu-tanh", "--tolerance")
  double budget_s = 120;    // shrinking stops here and keeps the shortest failing sequence found
  // Operations every candidate keeps at least one of ("shift", "truncate"): a shrink that would slip to
  // another bug failing the same way (a rollback after a restore for one after a shift) cannot drop them.
  std::vector<std::string> keep_ops;
  // Also match the bundle's requests against the fault catalogue (ReproResult::matches).
  bool diagnose = false;
  std::string out_dir;      // the bundle's folder (created; must not exist or be empty)
  std::string export_command;  // the one command that writes the model file again (REPORT.md)
  // Where the transcript begins with another row's requests (the main run, before the row's own): that
  // row and how many they are (REPORT.md says so).
  std::string after_row;
  size_t after_requests = 0;
};

// The bundle written for one row, or why none was.
struct ReproResult {
  std::string row;
  std::string sent_by;  // the row whose requests the bundle replays, where this row judged another's (the main run)
  std::string dir;      // the bundle; "" when none
  std::string why_not;  // why there is no bundle
  bool right_alone = false;  // no bundle because a fresh engine answered every request right
  std::string after;         // the requests the bundle's sequence began with: "" (the row's own), or the main run's sender
  size_t requests_before = 0, requests_after = 0;  // the row's requests (with `after`'s), the bundle's
  int64_t candidates = 0;                          // sequences replayed while shrinking
  double seconds = 0;
  std::string failure;  // the bundle's failure in one line, in the engine's terms
  // With ReproSetup::diagnose: the faults of our catalogue (faults.h, FaultUse::Diagnosis) whose model and
  // cache, sent the bundle's requests, answer first wrongly at the same request, the same way; the
  // nearest in magnitude first. `diagnosis` says it in a sentence.
  std::vector<std::string> matches;
  std::string diagnosis;
  bool ok() const { return !dir.empty(); }
};

// A fresh engine process speaking the protocol, greeted and loaded as the row's was: `call` sends one
// request and returns its parsed answer (ok or not), throwing EngineUnusable when it cannot.
class ReplayEngine {
 public:
  virtual ~ReplayEngine() = default;
  virtual nlohmann::json call(const nlohmann::json& request) = 0;
};
using ReplayEngineFactory = std::function<std::unique_ptr<ReplayEngine>()>;

// Shrinks `t` against engines from `fresh` (one for the run, another whenever one stops answering) and
// our `model`, writes the bundle into setup.out_dir and confirms it on one more fresh engine. Progress
// on `progress`. Never throws for the engine's sake: a row that cannot be bundled says why.
ReproResult reproduce(const Transcript& t, const ReproSetup& setup, GPT& model, const ReplayEngineFactory& fresh,
                      const std::function<void(const std::string&)>& progress);

// The operations a reproduction replays (rows by id: reset, prefill, step, extend, fork, ...).
const std::vector<std::string>& replayed_operations();

// repro.py, as written into every bundle.
const std::string& repro_script();

}  // namespace tinygpt::checks
