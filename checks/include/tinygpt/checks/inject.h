// Fault injection: every fault variant runs through every check; the matrix says which check
// caught which fault. The run fails when a fault is missed by every check, when a check a fault
// names as expected misses it, or when a production variant (the negative controls) fails. A check
// that could not finish on a fault (its variant threw) is an error: shown in its own column and
// never counted as catching it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tinygpt/checks/check_suite.h"

namespace tinygpt::checks {

struct FaultOutcome {
  std::string fault, description;
  std::vector<std::string> expected;  // checks that must catch it
  std::vector<CheckResult> checks;    // the model checks; status fail == caught
  // Identical new tokens before the fault's greedy output leaves the correct cached output
  // (the seed's measure, over drift_window tokens); nullopt when it never drifts.
  std::optional<int64_t> drift_after;
  int64_t drift_window = 100;
  std::optional<int64_t> first_logit_position_over;  // production loop or teacher-forced, any reference
  double worst_logit_diff = 0;
  std::vector<double> step_diffs;  // the production loop vs the banded reference, per step
  bool drift_measured = true;                    // false when its run made no greedy main run
  // Whether the fault changes this model's outputs at all over its rows' inputs. Measured for a fault no
  // row caught, none erred on and every row that must catch it ran: its largest effect (every logit row's worst |diff| against our model, the production
  // loop's and the teacher-forced run's at every step) against the model's own noise there (the same
  // rows through the production caches, the negative controls) - within kInertMargin of it, and its greedy ids
  // the controls' own, the fault is not observable on this model: it computes what the correct path
  // computes, and neither fails nor passes the matrix. A caught fault is observable by its catch.
  bool observable = true;
  bool effect_measured = false;  // effect and noise below were measured (a missed fault judged by logits)
  double effect = 0;       // its largest effect over its rows (a |diff| of logits)
  double noise = 0;        // the controls' largest over the same rows
  std::string inert_why;   // not observable: why, where the fault names it (CacheVariant::inert_on), else ""
  // "not observable on this model (largest effect 6.2e-06 against its own noise 4.1e-06: why)".
  std::string inert_text() const;
  std::optional<int64_t> seed_drift;             // the seed's own figure for this fault, where it reports one
  bool ran(const std::string& check) const;      // the check ran: part of its run and not skipped
  bool caught() const;                           // some check failed on it
  bool caught_by(const std::string& check) const;  // that check's status is fail
  std::vector<std::string> missed_expected() const;
  std::vector<std::string> errors() const;       // checks that could not finish on it
};

struct InjectionReport {
  std::vector<FaultOutcome> faults;
  std::vector<EquivalenceResult> controls;  // the production variants through the same checks (must pass)
  // Every check any fault's run made, in the check table's order: the matrix's columns.
  std::vector<std::string> check_names() const;
  int caught() const;
  int observable() const;      // the faults that change the model's outputs (FaultOutcome::observable)
  bool controls_passed() const;
  bool faults_passed() const;  // every observable fault caught, each by every check it expects
  bool passed() const;         // and the controls pass
};

// One cell of the fault matrix: what a check did in a fault's run, and whether the fault names that
// check as one that must catch it. Every view (console, JSON, Markdown, HTML) prints the same model
// with the same symbols (cell_symbol).
struct MatrixCell {
  // Inert: it ran and passed on a fault that cannot show on this model (FaultOutcome::observable).
  enum Kind { Caught, Missed, Error, NotRun, Inert } kind = NotRun;
  bool expected = false;
};
struct FaultMatrix {
  std::vector<std::string> checks;              // the columns: every check any fault's run made, in table order
  std::vector<const FaultOutcome*> faults;      // the rows
  std::vector<std::vector<MatrixCell>> cells;   // [fault][check]
};
FaultMatrix fault_matrix(const InjectionReport& r);
// "caught*" (caught by a check it must be caught by), "caught", "MISSED*" (a check it must be caught
// by did not catch it), "missed", "error" / "ERROR*" (the check could not finish: never a catch), "not run",
// "n/o" (it passed on a fault this model cannot show: neither a catch nor a miss).
std::string cell_symbol(const MatrixCell& c);
// The legend every view prints with the matrix.
extern const char* const kMatrixLegend;

// A missed fault whose largest effect is within this factor of the controls' own noise over the same
// rows, its greedy ids theirs, is not observable on the model (FaultOutcome::observable). The order of a
// sum changes fp32 logits by a few ulps of their size; a planted bug that changes the arithmetic
// changes them by orders of magnitude more (docs/checks.md, "Faults a model cannot show").
constexpr double kInertMargin = 4;

struct InjectionOptions {
  int64_t drift_tokens = 100;  // the seed's drift measure
  // New tokens of each fault's run (0: as the controls). Faults past the window show from
  // position `context`, so context + 64 catches them at half the cost of the seed's 600.
  int64_t fault_tokens = 0;
  // New tokens of the `batch` and `sampled` checks, and decode steps of `ragged`, `join-leave` and
  // `fork`, in each fault's run (0: as for the controls). The faults those are meant for (rows mixed
  // or shifted, a penalty history without the prompt, positions from the padding or the batch, a
  // reused slot, a shared fork) show from the first step; every past-window fault has
  // window-reference and teacher-forced at fault_tokens, and rollback always crosses the edge.
  int64_t fault_side_tokens = 0;
  std::vector<const CacheVariant*> controls;  // empty: every production variant of the registry
  // The checks the controls run (empty: the default set); each fault runs its own list (CacheVariant::checks).
  std::vector<std::string> control_checks;
  const Reference* reference = nullptr;       // reuse a reference built for `opts` (else built here)
  // Runs (controls and faults) checked at once (run_in_parallel): 0 = default_workers. Each run
  // has its own cache and generators: the worker count changes no figure. The intra-op threads
  // per run can, in the last bits (LibTorch's reductions split by thread count).
  int workers = 0;
  // Other jobs for the same pool (verify's: the budgeted caches, the goldens that reuse the
  // reference), run after the controls and before the faults, so no worker waits at the end; each
  // must share no mutable state with the runs or with the others.
  std::vector<std::function<void()>> beside;
};

InjectionReport run_injection(GPT& model, const EquivalenceOptions& opts,
                              const std::vector<const CacheVariant*>& faults, const InjectionOptions& io = {},
                              const std::function<void(const std::string&)>& progress = {});

std::string format_injection(const InjectionReport& r);

}  // namespace tinygpt::checks
