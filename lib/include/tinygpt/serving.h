// What a serving engine does to a KV cache, on our model: a batch of independent sequences ("rows")
// of different lengths, each with a cache of its own and positions of its own, decoded together;
// rows join a running batch and leave it, fork (a copy that continues differently) and roll back
// (drop the tokens of a rejected speculative draft), extend (a chunk of a prompt, or tokens appended
// after generating), verify (a block of tokens for each of several rows in one step: speculative
// decoding's verify step, speculative.h's speculate_rows), and reuse a released row's entries for a new prompt that shares its prefix
// (llama-server's prompt cache: the shared entries are kept, the rest is computed, always at least
// the prompt's last token, whose logits are the answer). The arithmetic is the model's own step at
// per-row positions over the rows' keys assembled into one padded batch, each row seeing only its
// own (the cache's key mask). Fork copies a row's cache (no copy-on-write: a fork is rare next to a
// decode step, and a copy can never leak writes into its parent). Rollback keeps SPEC 4's window
// over the sequence that remains: a cache keeps kRollbackEntries beyond the window to restore.
//
// The loop's bookkeeping (where a row's tokens sit, what a reused row slot starts from) is a
// ServingSchedule, so a harness can plant a loop bug without a branch here.
// Leaves out paging and sharing between live rows: every live row's entries are its own.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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
  // Position of token i of a chunk appended to a row whose next position is `row_next` (extend).
  // Production: row_next + i (a chunk continues the row; it does not start again at 0).
  virtual int64_t extend_position(int64_t row_next, int64_t i) const;
  // Whose position counter request `request` of a step reads and advances, `rows` the step's row
  // ids in request order. Production: rows[request], the request's own row.
  virtual int64_t step_counter(const std::vector<int64_t>& rows, size_t request) const;
  // How many entries of a released row to keep for a new prompt of `prompt_len` tokens whose first
  // `shared` tokens equal that row's. Production: all the shared ones but never the whole prompt
  // (its last token is computed again: its logits are the answer).
  virtual int64_t reused_prefix(int64_t shared, int64_t prompt_len) const;
  // How many positions a context shift that dropped `discard` entries rotates the later keys back by.
  // Production: discard (each kept key becomes the key of its new position).
  virtual int64_t shift_rotation(int64_t discard) const;
  // A row's next position after a context shift dropped `discard` of its `next` tokens. Production:
  // next - discard.
  virtual int64_t shift_next(int64_t next, int64_t discard) const;
  // Whether a slot's entries may serve a new prompt's prefix: a row that left (`live` false) and never
  // went past the `context` (`peak`: the furthest it went; past the window a cache's first entries are
  // on their way out). Production: exactly those.
  virtual bool reusable(bool live, int64_t peak, int64_t context) const;
  // What a context shift leaves of a kept later token for a later prompt to match. Production: -1
  // (its entry was computed beside the dropped tokens: never a cold run's).
  virtual int64_t shifted_token(int64_t id) const;
  // Whether a context shift re-rotates kept keys with the model's RoPE scaling (SPEC 10). Production: yes.
  virtual bool shift_uses_rope_scaling() const { return true; }
  // What a context shift multiplies every key in the batch by, of every row and every layer, moved or
  // not (llama.cpp's K-shift rotates each cell by its own delta, 0 included). Production: 1.
  virtual double shift_key_gain(const Config&) const { return 1.0; }
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
  // slot is taken first); `logits` (R, V) their last position's. A prompt that shares a prefix with
  // a released row that never left the window takes that row's slot and keeps the shared entries
  // (reused(): how many, per new row); only its remaining tokens are computed, as one chunk.
  std::vector<int64_t> add(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits);
  // Entries each row of the last add() kept from a released row (0: computed from scratch).
  const std::vector<int64_t>& reused() const { return reused_; }
  // One token for each of `rows` (ids (R)), decoded in one batch, each at its own next position: (R, V).
  at::Tensor step(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids);
  // Several tokens for one row in one call (a chunk of a prompt, or tokens appended after generating),
  // at its next positions, each seeing the row's entries and the chunk's earlier tokens: (1, V), the
  // last new position's logits. The chunk must end inside the window (positions < context): past it
  // SPEC 4's rolling window differs for every query of the chunk.
  at::Tensor extend(int64_t row, const std::vector<int64_t>& ids);
  // Several tokens for each of `rows` in ONE batched step (a speculative verify step: each row's last id
  // and its drafts), each row at its own next positions, each position seeing what `policy` lets it
  // (speculative.h's VerifyPolicy: a one-token step's view at every position, past the window too).
  // Blocks of different lengths are padded after their ends; the padding's entries are dropped again.
  // Returns each row's (T_r, V) logits, one row per token of its block. The rows' caches must roll back
  // (unsupported() == ""): std::invalid_argument otherwise, for an empty block or a row listed twice.
  std::vector<at::Tensor> verify(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& blocks,
                                 const AttentionPolicy& policy);
  // A context shift (llama.cpp's seq_rm + seq_add, when a conversation fills the window): drops the
  // `discard` entries after the first `keep` of `row` and renumbers the later ones down by `discard`,
  // their keys rotated back by `discard` positions (RoPE sees distances only: a kept key becomes the
  // key of its new position, its content unchanged); the row's next position moves down by `discard`.
  // The kept later entries were computed beside the dropped tokens, so they are never reused for a
  // later prompt (add). The row's cache must hold an entry for every token it was fed (the row never
  // left the window): std::invalid_argument otherwise or for a span outside the row, std::logic_error
  // when the cache cannot give its entries (KVCache::save_unsupported).
  void shift(int64_t row, int64_t keep, int64_t discard);
  // A new row continuing from `row`'s state; returns its id.
  int64_t fork(int64_t row);
  // Drops the newest n tokens of `row` (a rejected draft).
  void truncate(int64_t row, int64_t n);
  // `row` leaves the batch; its slot may be taken by a later row.
  void release(int64_t row);

  // A row's state as a value (llama.cpp's llama_state_seq_*): what its cache keeps, per layer, its
  // next position and the ids fed.
  struct RowState {
    std::vector<std::pair<at::Tensor, at::Tensor>> layers;  // per layer K, V (1, H, S, hd) float32 on the CPU; undefined when empty
    int64_t next = 0, peak = 0;
    std::vector<int64_t> tokens;  // -1 where an entry is not a cold run's (kept by a context shift)
  };
  // Throws std::logic_error when the rows' caches cannot give their entries (KVCache::save_unsupported).
  RowState save(int64_t row) const;
  // A new row that continues exactly as the saved one would have: its id.
  int64_t restore(const RowState& state);

  std::vector<int64_t> rows() const;       // the live rows, by id
  int64_t next_position(int64_t row) const;  // tokens fed to `row` so far
  KVCache& cache(int64_t row);
  const Config& config() const;
  c10::Device device() const;  // where the model's weights (and the rows' entries) are

 private:
  struct Slot {
    std::unique_ptr<KVCache> cache;
    int64_t next = 0;  // the next token's position
    bool live = false;
    std::vector<int64_t> tokens;  // the ids fed, in order (what a later prompt may share); -1 after a shift's keep
    int64_t peak = 0;             // the furthest `next` since the slot was taken: past the window, entries are gone
  };
  void advance(Slot& s, int64_t n) { s.next += n, s.peak = std::max(s.peak, s.next); }
  Slot& live(int64_t row);
  bool can_roll_back(const Slot& s, int64_t n) const;
  int64_t take_slot();
  // The released slot sharing the longest prefix with `prompt` (and how long), not in `taken`; -1 if none.
  std::pair<int64_t, int64_t> reusable(const std::vector<int64_t>& prompt, const std::vector<int64_t>& taken) const;
  // One batched step of `rows`: ids and positions (R, T), each row's left padding -> (R, V) the last
  // column's logits, or (R, T, V) every column's (`every`).
  at::Tensor run(const std::vector<int64_t>& rows, const at::Tensor& ids, const at::Tensor& positions,
                 const std::vector<int64_t>& pads, const AttentionPolicy& policy, bool every = false);

  GPTImpl& model_;
  RowCacheFactory make_cache_;
  DecodePath path_;
  const ServingSchedule& schedule_;
  std::vector<Slot> slots_;
  std::vector<int64_t> reused_;
};

// A row state as bytes (an opaque value a server stores or sends elsewhere) and back. The bytes
// are this library's own layout (native byte order); from_bytes throws std::invalid_argument on
// anything it did not write.
std::string to_bytes(const RowBatch::RowState& state);
RowBatch::RowState row_state_from_bytes(const std::string& bytes);

}  // namespace tinygpt
