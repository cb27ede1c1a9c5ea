// What a serving engine does to a KV cache, on our model: a batch of independent sequences ("rows")
// of different lengths, each with a cache of its own and positions of its own, decoded together;
// rows join a running batch and leave it, fork (a copy that continues differently) and roll back
// (drop the tokens of a rejected speculative draft). The arithmetic is the model's own step at
// per-row positions over the rows' keys assembled into one padded batch, each row seeing only its
// own (the cache's key mask). Fork copies a row's cache (no copy-on-write: a fork is rare next to a
// decode step, and a copy can never leak writes into its parent). Rollback keeps SPEC 4's window
// over the sequence that remains: a cache keeps kRollbackEntries beyond the window to restore.
//
// The loop's bookkeeping (where a row's tokens sit, what a reused row slot starts from) is a
// ServingSchedule, so a harness can plant a loop bug without a branch here.
// Leaves out paging and prefix sharing: every row's entries are its own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tinygpt/decode_step.h"
#include "tinygpt/generate.h"
#include "tinygpt/kv_cache.h"

namespace tinygpt {

class GPTImpl;

class ServingSchedule {
 public:
  virtual ~ServingSchedule() = default;
  // Position of column `col` of a prefill whose row is left-padded by `pad` columns. Production:
  // col - pad (each row's tokens from 0, whatever the padding).
  virtual int64_t prefill_position(int64_t col, int64_t pad) const;
  // Position of a decode token of a row whose own next position is `row_next`, stepped in a batch
  // whose rows' next positions reach `batch_next`. Production: row_next (a row that joined later, or a
  // shorter row of a ragged batch, keeps its own count).
  virtual int64_t step_position(int64_t row_next, int64_t batch_next) const;
  // A row slot freed by `release` and taken by a new row. Production: reset its cache.
  virtual void reuse(KVCache& cache) const;
};
const ServingSchedule& production_serving();

// One cache per row, as the variant makes them.
using RowCacheFactory = std::function<std::unique_ptr<KVCache>()>;

class RowBatch {
 public:
  // `model` and `schedule` must outlive the batch. `path.step` is not used (a step function is bound
  // to one cache; rows have many).
  RowBatch(GPTImpl& model, RowCacheFactory make_cache, DecodePath path, const ServingSchedule& schedule = production_serving());

  // Why the row operations cannot run on these caches ("" when they can).
  std::string unsupported() const;

  // New rows from prompts of any lengths (each its last `context` tokens), prefilled together:
  // left-padded to the longest, every row at its own positions. Returns the new rows' ids (a freed
  // slot is taken first); `logits` (R, V) their last position's.
  std::vector<int64_t> add(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits);
  // One token for each of `rows` (ids (R)), decoded in one batch, each at its own next position: (R, V).
  at::Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids);
  // Several tokens for one row in one call (a chunk of a prompt, or tokens appended after generating),
  // at its next positions, each seeing the row's entries and the chunk's earlier tokens: (1, V), the
  // last new position's logits. The chunk must end inside the window (positions < context): past it
  // SPEC 4's rolling window differs for every query of the chunk.
  at::Tensor extend(int64_t row, const std::vector<int64_t>& ids);
  // A new row continuing from `row`'s state; returns its id.
  int64_t fork(int64_t row);
  // Drops the newest n tokens of `row` (a rejected draft).
  void truncate(int64_t row, int64_t n);
  // `row` leaves the batch; its slot may be taken by a later row.
  void release(int64_t row);

  std::vector<int64_t> rows() const;       // the live rows, by id
  int64_t next_position(int64_t row) const;  // tokens fed to `row` so far
  KVCache& cache(int64_t row);

 private:
  struct Slot {
    std::unique_ptr<KVCache> cache;
    int64_t next = 0;  // the next token's position
    bool live = false;
  };
  Slot& live(int64_t row);
  int64_t take_slot();
  at::Tensor run(const std::vector<int64_t>& rows, const at::Tensor& ids, const at::Tensor& positions,
                 const std::vector<int64_t>& pads);

  GPTImpl& model_;
  RowCacheFactory make_cache_;
  DecodePath path_;
  const ServingSchedule& schedule_;
  std::vector<Slot> slots_;
};

}  // namespace tinygpt
