// Churn: a long, generated sequence of serving operations - rows admitted with prompts of random
// lengths, stepped in random groups, forked, rolled back, extended, context-shifted, saved and
// restored, released - after which every row, live or gone, is compared with its own sequence alone
// (a row with a context shift in its history, with the model's own entries shifted by hand the same
// way: reference_entries.h). What cache-layout bugs need to show:
// slots freed out of order and taken again, rows of many lengths side by side, a fork of a row whose
// entries moved. The `churn` row runs a seeded plan (churn_plan); the RapidCheck property
// (tests/checks/test_churn.cpp) generates the operations with rc::state, so a failure shrinks to the
// shortest sequence that fails, printed as a script (to_string of each operation) that replays it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "tinygpt/checks/judge.h"
#include "tinygpt/checks/ops.h"
#include "tinygpt/gpt.h"

namespace tinygpt::checks {

class DecodeTarget;
class ReferenceEntries;

// One operation. Rows are numbered in the order they were admitted or forked; a released row keeps
// its number (and is judged with the others at the end). The ids fed are not part of it: the id at
// position p of row k is churn_token (a function of k, p and how often k was rolled back), so a
// script of operations replays exactly.
struct ChurnOp {
  enum class Kind { Admit, Step, Fork, Truncate, Release, Extend, Shift, Save, Restore };
  static constexpr int kKinds = 9;
  Kind kind = Kind::Step;
  // Step: the rows stepped together; Fork, Truncate, Release, Extend, Shift, Save: the one row;
  // Restore: none (a new row, numbered as an admitted one).
  std::vector<int64_t> rows;
  // Admit: prompt length; Step: steps; Truncate: tokens dropped; Extend: chunk length; Shift: entries
  // dropped after the first `keep`; Restore: which saved state (0: the first `save`).
  int64_t n = 1;
  int64_t keep = 0;  // Shift: entries kept at the start
};
// One line per operation: "admit 12", "step 0,2 x5", "fork 1", "truncate 2 by 3", "release 0",
// "extend 1 by 4", "shift 1 keep 4 drop 20", "save 2", "restore 0" (the first saved state).
std::string to_string(const ChurnOp& op);
// The id fed at `position` of row `row` after `rollbacks` rollbacks and shifts of it, in [0, vocab).
int64_t churn_token(int64_t row, int64_t position, int64_t rollbacks, int64_t vocab);

// Which operations a plan may use beyond admitting, stepping and releasing rows (a target without
// fork, truncate, extend, shift or save gets none of those), and whether a row may leave the window.
struct ChurnOps {
  Ops offered{Op::Fork, Op::Truncate, Op::Extend, Op::Shift, Op::Save};
  bool past_window = true;
  bool has(Op o) const { return offered.has(o); }
};

// The operations `t` offers (DecodeTarget::unsupported says which it lacks).
ChurnOps churn_ops_of(const DecodeTarget& t, bool past_window = true);

// What a churn run's rows are, without tensors: enough to say which operations apply (and for
// RapidCheck's model of the run).
struct ChurnShape {
  struct Row {
    bool live = true;
    int64_t next = 0;    // tokens fed: the next position
    int64_t stored = 0;  // entries a cache keeps (the window and kRollbackEntries more)
    int64_t rollbacks = 0;  // rollbacks and shifts (the ids after one differ from those before)
    bool shifted = false;   // a context shift in its history: it stays inside the window from then on
    int64_t local = 0;      // entries a sliding layer keeps (its window w - 1 and kRollbackEntries more; SPEC 10)
  };
  int64_t context = 0, max_live = 8;
  int64_t sliding = 0;  // the model's sliding window w, 0 when no layer slides
  ChurnOps ops;  // the operations the target has (the others never apply); past_window false: no step takes a row past the window
  std::vector<Row> rows;
  std::vector<Row> saved;   // each `save`'s row, in order
  int64_t live() const;
  std::vector<int64_t> live_rows() const;
  // Whether `op` is one the serving contract defines here: live rows, prompts and chunks that end
  // inside the window, a rollback no longer than the entries kept for it (SPEC 4), at most max_live
  // rows, a context shift of a row whose cache holds every entry of it (inside the window, never
  // trimmed) that keeps at least one later entry, a restore of a state saved before. With sliding
  // layers, a rollback or a shift whose remaining row needs an entry a sliding layer no longer keeps
  // does not apply (RowBatch refuses it: the window it would attend to is gone).
  // The first position a sliding layer would need after dropping `n` after `keep` (a shift) is held.
  bool sliding_keeps(const Row& r, int64_t keep, int64_t n) const;
  bool applicable(const ChurnOp& op) const;
  void apply(const ChurnOp& op);  // the shape after `op` (which must be applicable)
};

// What one row showed: its sequence, and the logits seen at some of its positions; logits[i] (V)
// predicts seq[positions[i] + 1] (positions as they were when shown: a shift renumbers them).
struct ChurnRow {
  std::vector<int64_t> seq;  // after a shift: the kept ids, renumbered
  std::vector<int64_t> positions;
  std::vector<at::Tensor> logits;
  std::vector<int64_t> shown_by;  // the index in the script of the operation that showed each
  // (V) per shown logits: the reference's at the same point, where the row has been shifted (from
  // the first shift on, every one); undefined: judged against the row's sequence alone.
  std::vector<at::Tensor> expected;
  // The index in the script of every operation in the row's history, its parent's (a fork's) or its
  // saved row's (a restore's) included, in order.
  std::vector<int64_t> history;
};

// A churn run on a target (reset first): applies operations, recording what each row showed. The
// model is the reference's: a shifted row's reference logits are computed as the row runs.
class ChurnRun {
 public:
  ChurnRun(DecodeTarget& target, GPT& model, int64_t max_live = 8, const ChurnOps& ops = {});
  ~ChurnRun();
  const ChurnShape& shape() const { return shape_; }
  // Runs `op` on the target; throws std::logic_error when it is not applicable.
  void apply(const ChurnOp& op);
  // Every row, with the reference logits of its shifted positions computed (those are fed to the
  // reference's entries a chunk at a time, when the row's entries are next needed or here).
  const std::vector<ChurnRow>& rows();
  // The rows whose logits the last operation showed.
  const std::vector<int64_t>& touched() const { return touched_; }
  const std::vector<ChurnOp>& script() const { return script_; }

 private:
  struct Saved {
    std::string state;  // the target's
    ChurnRow row;
    std::shared_ptr<ReferenceEntries> entries;
  };
  // Feeds `ids` to row k's reference entries; `shown`: the row shows the logits of the last of them
  // (its expected[] entry at the row's newest shown position is filled in by settle()).
  void reference_feed(int64_t k, const std::vector<int64_t>& ids);
  // Row k's fed ids through its entries in one chunk (the model's step over all of them, every
  // position's logits), filling in the expected logits of the positions shown meanwhile.
  void settle(int64_t k);
  struct Pending {
    std::vector<int64_t> ids;                          // fed to the entries since the last settle
    std::vector<std::pair<int64_t, size_t>> shown;     // (index in ids, index in the row's expected)
  };
  std::vector<Pending> pending_;  // per row
  DecodeTarget& target_;
  GPT model_;
  int64_t vocab_;
  ChurnShape shape_;
  std::vector<int64_t> ids_;  // the target's row id of each row
  std::vector<ChurnRow> rows_;
  std::vector<std::shared_ptr<ReferenceEntries>> entries_;  // per row: the reference's, from its first shift (null before)
  std::vector<Saved> saved_;
  std::vector<int64_t> touched_;
  std::vector<ChurnOp> script_;
};

// `n` applicable operations from `seed`: about 1 admission or release in 5, forks, rollbacks,
// extensions, shifts, saves and restores in between, and runs of steps long enough to take rows
// past the window.
std::vector<ChurnOp> churn_plan(uint64_t seed, int64_t n, int64_t context, int64_t max_live, const ChurnOps& ops);

// A row against our reference over its own sequence alone (or its shifted entries), at every
// position it showed.
struct ChurnVerdict {
  bool ok = true;             // within the bounds (judge.h)
  std::string why;            // the judge's reason when not
  double worst = 0;           // largest |diff|
  int64_t first_over = -1;    // the position of the first shown logits over the bound that judged it; -1 if none
  int64_t index = -1;         // their index in the row's positions
  double diff_there = 0;      // their |diff|, or their KL when the row is judged by the distribution
  double kl_mean = 0;         // mean KL(reference || shown) over the row's shown positions
};
// Where a failing row first parted, as a bug keeps it across engines (a diagnosis matches by it,
// diagnose.h): the operations other than steps in the row's history between its last right logits and
// its first wrong ones (the request that preceded the divergence; when only steps came between, the
// row's last operation before them), each's kind in words ("fork", "release + admit", "admit",
// "truncate", "extend", "shift", "save", "restore") and the entries it touched; how many of the row's
// logits after the first of them were still right; and the position in both frames (the request's
// counts every id fed; the engine's is renumbered by the row's shifts).
struct ChurnSignature {
  std::vector<int64_t> ops;  // indices in the script, in order
  std::vector<std::string> kinds, entries;  // per operation
  int64_t shown_after = 0;
  int64_t position_request = -1, position_engine = -1;
  // The kinds, sorted and unique, joined by commas: "extend,fork" (the report's label "op").
  std::string kinds_text() const;
  // "fork (operation 6, `fork 1`; entries copied from the parent), then extend (...), at the first logits after it".
  std::string text(const std::vector<ChurnOp>& plan) const;
};

// The signature of `row`'s failure `v` (not ok) in a run of `script`.
ChurnSignature churn_signature(const std::vector<ChurnOp>& script, const ChurnRow& row, const ChurnVerdict& v);

// Judged by the one judge at `t`: max |diff| by default; mean KL and top-1 agreement when t has them
// (first_over is then the first position whose own KL is over the bound, or where the argmax first
// parted, or the row's first position).
ChurnVerdict churn_verdict(GPT& model, const ChurnRow& row, const Tolerances& t);
// The churn row's seed: verify and conform run the same plan every time.
inline constexpr uint64_t kChurnSeed = 36;
inline constexpr int64_t kChurnOps = 200, kChurnLive = 8;
// In shortened runs (EquivalenceOptions::serving_tokens, the fault matrix's): the plan's first this many.
inline constexpr int64_t kChurnShortOps = 64;

}  // namespace tinygpt::checks
