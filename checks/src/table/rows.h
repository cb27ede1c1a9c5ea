// Pieces the rows of the check table share: the verdict and comparison helpers of the model rows,
// and the row runs of the serving rows. Private to the harness; each row is a function in a file
// of this folder, named by check_table.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "tinygpt/checks/check_suite.h"

namespace tinygpt::checks {

// The tag sets most rows of the table have (each row's CheckDef is in its own file).
inline constexpr Tags kDefaultRow = static_cast<Tags>(Tag::Default);  // the default set
inline constexpr Tags kPastRow = Tag::Default | Tag::PastWindow;       // ... reaching past the window
inline constexpr Tags kServingRow = Tag::Serving | Tag::PastWindow;    // what serving engines do, past the window too

// A row's constants in its prose, so a description never says a number its code does not use:
// "3, 9, 17" (list_text), "1-8, 15-17 and 31-33" for ascending runs (ranges_text).
std::string list_text(const std::vector<int64_t>& v);
std::string ranges_text(const std::vector<int64_t>& v);

// Sets the row's verdict (pass or fail) and its detail.
void set_result(CheckResult& r, bool ok, std::string detail);
// A run's logits (B, n, V) against its references, full inside the window and banded every step, at
// the bounds in force; fills `r` (verdict, detail, statistics) and returns the banded comparison.
StepDiffs judge_row(CheckResult& r, const Tolerances& t, const at::Tensor& logits, const StepReference& ref, int64_t prompt_len);

// Logits observed at chosen positions of one sequence, got (1, m, V), against the reference's at the
// same positions, ref (1, m, V) (position p predicts the token after p): judged at the bounds in
// force like judge_row, the detail naming the position where it parts. Returns the comparison.
StepDiffs judge_positions(CheckResult& r, const Tolerances& t, const at::Tensor& got, const at::Tensor& ref,
                          const std::vector<int64_t>& positions);

// --- self: which in-window steps get a prefill of their own ---

// The self check's steps by default: every step of the first kSelfFirstSteps (a cache's first
// entries, where off-by-one bugs show), then every kSelfSpread-th, then the kSelfTightest more with
// the smallest top-2 margin of the run (where a small cache error changes a token), and the last.
inline constexpr int64_t kSelfFirstSteps = 16, kSelfSpread = 16, kSelfTightest = 8;
struct SelfSteps {
  std::vector<int64_t> steps;  // ascending, each in [1, inside)
  std::string how;             // "the first 16, every 16th, ..." for the row's detail
};
// stride >= 1: every stride-th step from 1 and the last; 0: the default choice above. margins
// (inside) float: the run's top-2 margin per step.
SelfSteps self_steps(int64_t inside, int64_t stride, const at::Tensor& margins);

// --- serving rows: rows of a running batch, each judged against its own sequence alone ---

// Serving rows run until their rows are this far past the window (every past-window serving fault
// shows within a few steps of the edge).
inline constexpr int64_t kPastTheWindow = 16;

// One row of a serving run: its whole sequence (prompt first) and the logits each new token was
// chosen from: logits[i] (V) predicts seq[prompt + i].
struct RowRun {
  std::vector<int64_t> seq;
  int64_t prompt = 0;
  std::vector<at::Tensor> logits;
};
// A live row: the target's row id, its run, and the logits its next token is chosen from (V).
struct LiveRow {
  int64_t id;
  RowRun* run;
  at::Tensor next;
};

// A deterministic prompt of `len` ids for row `b` (different rows, different ids).
std::vector<int64_t> serving_prompt(int64_t len, int64_t b, int64_t vocab);
// EquivalenceOptions::variation as the serving rows use it (0: the documented runs).
int64_t held_out(const CheckContext& c);
// `len` ids of serving_prompt's row b, other ids under a variation N > 0 (row b + 16 N).
std::vector<int64_t> row_ids(const CheckContext& c, int64_t len, int64_t b);
// A serving row's short prompt under EquivalenceOptions::variation: serving_prompt(len, b) at 0; at
// N > 0 up to 6 ids longer and of other ids (the row's schedule, counted from its prompt, moves too).
std::vector<int64_t> row_prompt(const CheckContext& c, int64_t len, int64_t b);
// The greedy id of one row of logits (V).
int64_t top1(const at::Tensor& row);
// Decode steps of a serving row: `full`, or fewer where the options cap them (serving_tokens).
int64_t serving_steps(const CheckContext& c, int64_t full);
// `n`, or in a run kept inside the window (--no-past-window, a declared no-window) at most the steps that
// keep a row of `prompt` tokens inside it: its last logits at position context.
int64_t inside_window_steps(const CheckContext& c, int64_t n, int64_t prompt);
// Admits prompts as new rows of the target: their live rows over `runs` (one RowRun per prompt, made here).
std::vector<LiveRow> admit(CheckContext& c, const std::vector<std::vector<int64_t>>& prompts, std::vector<RowRun>& runs);
// One step of every live row with its greedy token, recording the logits it was chosen from.
void step_all(DecodeTarget& t, std::vector<LiveRow>& live);
// One step of every live row with ids[i] for live[i], recording the logits each was chosen from.
void step_with(DecodeTarget& t, std::vector<LiveRow>& live, const std::vector<int64_t>& ids);
// Records each live row's last logits and greedy token without feeding it (the run ends).
void finish(std::vector<LiveRow>& live);
// Judges every run against the reference of its own sequence alone; fills `r` and returns false at
// the first run over the bound. `worst` collects the largest banded |diff|.
bool judge_rows(CheckContext& c, CheckResult& r, const std::vector<std::pair<std::string, const RowRun*>>& runs, double& worst);

// --- rows judged at chosen positions of their sequences (chunked prefill, prefix reuse) ---

// What one row showed: its sequence, and the logits seen at some of its positions; logits[i] (V)
// predicts seq[positions[i] + 1].
struct Seen {
  std::vector<int64_t> seq;
  std::vector<int64_t> positions;
  std::vector<at::Tensor> logits;
  void add(int64_t position, const at::Tensor& l);
};
// Greedy steps of `row`, each chosen from the logits seen last.
void decode_seen(DecodeTarget& t, int64_t row, int64_t n, Seen& s);
// The seen logits against the reference over the row's own sequence alone; false (and `r` says
// where, after `what`) when over the bound. `worst`, when given, collects the largest |diff|.
bool judge_seen(CheckContext& c, CheckResult& r, const Seen& s, const std::string& what, double* worst = nullptr);

}  // namespace tinygpt::checks
