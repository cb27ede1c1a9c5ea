// Churn: a long, generated sequence of serving operations - rows admitted with prompts of random
// lengths, stepped in random groups, forked, rolled back, extended, released - after which every
// row, live or gone, is compared with its own sequence alone. What cache-layout bugs need to show:
// slots freed out of order and taken again, rows of many lengths side by side, a fork of a row whose
// entries moved. The `churn` row runs a seeded plan (churn_plan); the RapidCheck property
// (tests/checks/test_churn.cpp) generates the operations with rc::state, so a failure shrinks to the
// shortest sequence that fails, printed as a script (to_string of each operation) that replays it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tinygpt/gpt.h"

namespace tinygpt::checks {

class DecodeTarget;

// One operation. Rows are numbered in the order they were admitted or forked; a released row keeps
// its number (and is judged with the others at the end). The ids fed are not part of it: the id at
// position p of row k is churn_token (a function of k, p and how often k was rolled back), so a
// script of operations replays exactly.
struct ChurnOp {
  enum class Kind { Admit, Step, Fork, Truncate, Release, Extend };
  Kind kind = Kind::Step;
  std::vector<int64_t> rows;  // Step: the rows stepped together; Fork, Truncate, Release, Extend: the one row
  int64_t n = 1;              // Admit: prompt length; Step: steps; Truncate: tokens dropped; Extend: chunk length
};
// One line per operation: "admit 12", "step 0,2 x5", "fork 1", "truncate 2 by 3", "release 0", "extend 1 by 4".
std::string to_string(const ChurnOp& op);
// The id fed at `position` of row `row` after `rollbacks` rollbacks of it, in [0, vocab).
int64_t churn_token(int64_t row, int64_t position, int64_t rollbacks, int64_t vocab);

// What a churn run's rows are, without tensors: enough to say which operations apply (and for
// RapidCheck's model of the run).
struct ChurnShape {
  struct Row {
    bool live = true;
    int64_t next = 0;    // tokens fed: the next position
    int64_t stored = 0;  // entries a cache keeps (the window and kRollbackEntries more)
    int64_t rollbacks = 0;
  };
  int64_t context = 0, max_live = 8;
  bool past_window = true;  // false: no step takes a row past the window
  std::vector<Row> rows;
  int64_t live() const;
  std::vector<int64_t> live_rows() const;
  // Whether `op` is one the serving contract defines here: live rows, prompts and chunks that end
  // inside the window, a rollback no longer than the entries kept for it (SPEC 4), at most max_live rows.
  bool applicable(const ChurnOp& op) const;
  void apply(const ChurnOp& op);  // the shape after `op` (which must be applicable)
};

// What one row showed: its sequence, and the logits seen at some of its positions; logits[i] (V)
// predicts seq[positions[i] + 1].
struct ChurnRow {
  std::vector<int64_t> seq;
  std::vector<int64_t> positions;
  std::vector<at::Tensor> logits;
  std::vector<int64_t> shown_by;  // the index in the script of the operation that showed each
};

// A churn run on a target (reset first): applies operations, recording what each row showed.
class ChurnRun {
 public:
  ChurnRun(DecodeTarget& target, int64_t vocab, int64_t context, int64_t max_live = 8, bool past_window = true);
  const ChurnShape& shape() const { return shape_; }
  // Runs `op` on the target; throws std::logic_error when it is not applicable.
  void apply(const ChurnOp& op);
  const std::vector<ChurnRow>& rows() const { return rows_; }
  // The rows whose logits the last operation showed.
  const std::vector<int64_t>& touched() const { return touched_; }
  const std::vector<ChurnOp>& script() const { return script_; }

 private:
  DecodeTarget& target_;
  int64_t vocab_;
  ChurnShape shape_;
  std::vector<int64_t> ids_;  // the target's row id of each row
  std::vector<ChurnRow> rows_;
  std::vector<int64_t> touched_;
  std::vector<ChurnOp> script_;
};

// Which operations a plan may use (a target without extend, fork or truncate gets none of them).
struct ChurnOps {
  bool fork = true, truncate = true, extend = true;
  bool past_window = true;
};
// `n` applicable operations from `seed`, over ids in [0, vocab): about 1 admission or release in
// 5, forks, rollbacks and extensions in between, and runs of steps long enough to take rows past
// the window.
std::vector<ChurnOp> churn_plan(uint64_t seed, int64_t n, int64_t context, int64_t max_live, const ChurnOps& ops);

// A row against our reference over its own sequence alone, at every position it showed.
struct ChurnVerdict {
  double worst = 0;           // largest |diff|
  int64_t first_over = -1;    // the first position over the tolerance; -1 if none
  double diff_there = 0;
};
ChurnVerdict churn_verdict(GPT& model, const ChurnRow& row, double tolerance);
// The churn row's seed: verify and conform run the same plan every time.
inline constexpr uint64_t kChurnSeed = 36;
inline constexpr int64_t kChurnOps = 96, kChurnLive = 8;
// In shortened runs (EquivalenceOptions::serving_tokens, the fault matrix's): the plan's first this many.
inline constexpr int64_t kChurnShortOps = 48;

}  // namespace tinygpt::checks
