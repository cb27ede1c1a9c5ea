// What every check drives: a decode target. Three adapters implement it - our model through one
// registered cache variant (ModelTarget, below), an engine in any language over the conform
// protocol (conform.h), and a user's C++ cache through the conformance kit (a CacheVariant of
// theirs, so a ModelTarget again) - and every check in check_suite.h is written once against it.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tinygpt/checks/cache_variant.h"
#include "tinygpt/checks/ops.h"
#include "tinygpt/generate.h"
#include "tinygpt/gpt.h"
#include "tinygpt/laws/sampler_under_test.h"
#include "tinygpt/serving.h"
#include "tinygpt/speculative.h"

namespace tinygpt::checks {

// One generated sequence with the logits each of its new tokens was chosen from:
// seq (B, T0 + n) int64, logits (B, n, V) float32.
struct Generation {
  at::Tensor seq, logits;
};

// One request to an engine that schedules its own requests (op "generate"): a prompt, how many greedy
// tokens, and when it arrives - once the engine has made `after` tokens for the requests sent before it,
// and once every request in `after_finished` has finished. `copies` > 1 asks for that many sequences of
// the one prompt (forks: transformers' num_return_sequences, vLLM's n).
struct ServedRequest {
  int64_t id = 0;
  std::vector<int64_t> prompt;
  int64_t n = 1;
  int64_t after = 0;
  std::vector<int64_t> after_finished;
  int64_t copies = 1;
  // >= 0: the request may outgrow the window, and the engine shifts its context as llama-server does
  // (the first `keep` entries stay, a span after them goes, the rest move down); -1: it stays inside.
  int64_t keep = -1;
};
// One context shift an engine made in a sequence: before feeding the sequence's generated id `before`
// (chosen, not yet fed), the `discard` entries after the first `keep` went and the later ones moved down.
struct ServedShift {
  int64_t before = 0, keep = 0, discard = 0;
};
// What the engine answered for one sequence of a request: the ids it chose and what each was chosen
// from - the whole logits (n, V), or where the engine gives no more its top-N log-probabilities per step
// (top[i] = [(id, log p), ...]). `reused`: prompt tokens it served from its cache, when it says.
struct ServedResult {
  int64_t id = 0, copy = 0;
  std::vector<int64_t> ids;
  at::Tensor logits;  // (n, V) float32, or undefined
  std::vector<std::vector<std::pair<int64_t, double>>> top;
  std::optional<int64_t> reused;
  std::vector<ServedShift> shifts;  // in order; empty: none
};

// One sequence decoded speculatively (op "speculate", speculative.h): n new ids from `prompt` with the
// target's own draft-and-verify machinery, then `then_plain` plain greedy steps on the same cache (what
// a rollback left behind shows there). `draft`: "none" (no drafts: plain decoding through the same
// loop, sampler and stream), "self" (the target's own weights: always right at temperature 0),
// "contrary" (never right there), "ngram" (prompt lookup), "model" (`draft_model`) or "replay"
// (`replay`'s ids from the sequence's length on, those at multiples of `replay_period` moved by
// `replay_shift`: the target's own greedy run replayed is always right, moved by one never right, moved
// at every p-th id accepted in part, and none costs a draft step).
struct SpeculativeRequest {
  std::vector<int64_t> prompt;
  int64_t n = 1;
  std::string draft = "self";
  GPT draft_model{nullptr};
  std::vector<int64_t> replay;  // the whole sequence, prompt first
  int64_t replay_shift = 0, replay_period = 1;
  SpeculativeSettings settings;
  int64_t then_plain = 0;
};
// The draft kinds a request may name.
const std::vector<std::string>& draft_kinds();

// Per emitted id, the top-N (id, log-probability) an engine gives where it gives no logits (llama-server's
// n_probs).
using TopLogProbs = std::vector<std::vector<std::pair<int64_t, double>>>;
// A target's speculative run: the run, and where the target answered no logits (`logits` undefined),
// each id's top-N log-probabilities instead.
struct SpeculativeAnswer : SpeculativeRun {
  TopLogProbs top;
};

// What a target offers beyond prefill and step, in one value: the operations (ops.h) with why each
// missing one is, the draft kinds and acceptance rules it speculates with, whether its sampler can be
// seen, whether it makes a second instance of itself, whether it takes rows at all and how many at
// once, and the deviations it declares. A target states it once (DecodeTarget::offers()); every row
// asks it - and only it - before it calls, and an ability it lacks is skipped, saying why.
struct Offers {
  std::array<std::string, kOpCount> missing;  // per operation: "" offered, else why not
  // With Op::Speculate offered: per draft kind (draft_kinds()) and per rule (accept_rule_name), why the
  // target does not run it; a kind or rule absent here is offered with the operation.
  std::map<std::string, std::string> drafts_missing, rules_missing;
  std::string no_sampler;          // "" when the target's sampler can be seen (DecodeTarget::sampler()); else why not
  std::string no_second_instance;  // "" when the target makes a second instance of itself; else why not
  std::string no_rows;             // "" when the target takes prefill and step; else why not
  std::optional<int64_t> max_rows;  // the most rows at once (hello's "max_rows"); none: no limit
  std::vector<std::string> deviations;  // declared deviations from our model ("gelu-tanh")

  // "" when the target offers `op`, else why not (the rows that need it are then skipped, saying so).
  const std::string& why_not(Op op) const { return missing[static_cast<unsigned>(op)]; }
  // "" when the target decodes speculatively with this draft kind and rule; else why not.
  std::string why_not_speculate(const std::string& draft, AcceptRule rule) const;
  bool takes_rows() const { return no_rows.empty(); }
  // Whether `rows` rows at once are within the target's limit.
  bool takes(int64_t rows) const { return !max_rows || rows <= *max_rows; }
};
// The offer of a target with nothing beyond prefill and step: every operation missing ("the target
// does not support OP"), no sampler seen, no second instance, rows taken, no limit, no deviation.
Offers offers_nothing();

// What a serving engine does to its cache, on rows of a running batch by id (docs/protocol.md,
// protocol 2). A target that has rows returns this from DecodeTarget::serving(); which of the
// operations it offers is its Offers' to say, and a row asks before it calls.
class RowServing {
 public:
  virtual ~RowServing() = default;
  // New rows from prompts of any lengths (each at its own positions from 0), prefilled together, next
  // to any rows already running: their ids; `logits` (R, V) each one's last position. (Op::Ragged)
  virtual std::vector<int64_t> add_rows(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits) = 0;
  // One token for each listed row (ids, one per row), each at its own next position: (R, V).
  virtual at::Tensor step_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids) = 0;
  // `row` leaves the batch. (Op::Join)
  virtual void release_row(int64_t row) = 0;
  // Several tokens appended to `row` in one call (a prompt in chunks, or tokens added after
  // generating), each at its own next position: (V), the last new position's logits. (Op::Extend)
  virtual at::Tensor extend_row(int64_t row, const std::vector<int64_t>& ids) = 0;
  // A new row continuing from `row`: its id. (Op::Fork)
  virtual int64_t fork_row(int64_t row) = 0;
  // Drops the newest n tokens of `row` (a rejected draft). (Op::Truncate)
  virtual void truncate_row(int64_t row, int64_t n) = 0;
  // `row`'s state as an opaque value, and a new row from one that continues exactly as the saved row
  // would have (its id): after a reset too, in another slot, in another batch. (Op::Save)
  virtual std::string save_row(int64_t row) = 0;
  virtual int64_t restore_row(const std::string& state) = 0;
  // A context shift (llama.cpp's seq_rm + seq_add): drops the `discard` entries after the first `keep`
  // of `row` and renumbers the later ones down by `discard`, their keys re-rotated to their new
  // positions; the row's next position moves down by `discard`. (Op::Shift)
  virtual void shift_row(int64_t row, int64_t keep, int64_t discard) = 0;
  // Entries each row of the last add_rows kept from the target's own cache (a prefix it shared with
  // a released row), one per row, when the target says; empty when it does not.
  virtual std::vector<int64_t> reused() const { return {}; }
};

class DecodeTarget {
 public:
  virtual ~DecodeTarget() = default;

  // The name reports use ("rolling", "engine 'llama.cpp'").
  virtual std::string name() const = 0;
  // The window of the model the target runs (SPEC 4's `context`).
  virtual int64_t context() const = 0;

  // Forget every sequence: the next prefill starts at position 0.
  virtual void reset() = 0;
  // ids (B, T), 1 <= T <= context, at positions 0..T-1 through the cache -> (B, V) logits of each
  // row's last position.
  virtual at::Tensor prefill(const at::Tensor& ids) = 0;
  // ids (B, 1), one token per row at its next position -> (B, V).
  virtual at::Tensor step(const at::Tensor& ids) = 0;

  // The loop users run: a new sequence from `prompt` (B, T0), `n` tokens, each chosen by `choose`
  // from the logits of the sequence so far. A target with a loop of its own runs that (our
  // production loop, with its own bookkeeping); the default is drive().
  virtual Generation generate(const at::Tensor& prompt, int64_t n, const TokenChooser& choose);

  // The harness's own loop over reset, prefill and step, with SPEC 4's bookkeeping written out here:
  // prefill the last `context` prompt tokens, then one step per chosen token. The history the chooser
  // sees is the whole sequence so far.
  Generation drive(const at::Tensor& prompt, int64_t n, const TokenChooser& choose);

  // The target's sampler, seen through `pick` (and `filtered` where the target can show its scores).
  // std::logic_error where the offer says why not (Offers::no_sampler: the sampler rows are then skipped).
  virtual const props::SamplerUnderTest& sampler() const;

  // What `generate` runs, for the checks' details: "production loop" for our model, "engine" for an
  // engine over the protocol.
  virtual std::string loop_name() const { return "target"; }

  // --- What the target offers beyond prefill and step ---
  // Its offer (Offers, above), stated once by make_offers() and the same value from then on.
  const Offers& offers() const;
  // The serving operations (RowServing, above), for a row that asked offers() first: std::logic_error
  // with the offer's reason where the target has none (the default).
  virtual RowServing& serving();
  // The threads the target computes with from now on (op "threads"): returns the count before.
  // std::logic_error where the offer says why not.
  virtual int set_threads(int n);
  // Requests an engine schedules itself (op "generate": continuous batching, a server's slots): every
  // sequence's result, in any order. Serving rows that drive rows by id cannot see such an engine.
  virtual std::vector<ServedResult> serve(const std::vector<ServedRequest>& requests);
  // A second instance of the same target, sharing nothing with this one but the model it loads (an
  // engine: a new process, so a saved state restores into a fresh context). `save-restore` restores
  // its states there too. std::logic_error where the offer says why not (Offers::no_second_instance).
  virtual std::unique_ptr<DecodeTarget> second_instance() const;
  // A sequence decoded speculatively (op "speculate"): the ids, the logits each was chosen from and the
  // acceptance counts. std::logic_error where the offer says why not (Offers::why_not_speculate).
  virtual SpeculativeAnswer speculate(const SpeculativeRequest& request);
  // Plain decoding with the target's own sampler drawing from its own generator seeded with `seed`: what
  // seeded sample-and-match speculation must equal draw for draw. prompt (1, T0) -> n new ids. The
  // default is generate() with our sampler (the target samples as we do); an engine answers it with its
  // own loop ('speculate' with the draft "none"), its logits undefined where it gives top-N only.
  virtual Generation seeded(const at::Tensor& prompt, int64_t n, const SamplingSettings& s, uint64_t seed);

 protected:
  // The target's offer, asked once (offers()). The default: offers_nothing().
  virtual Offers make_offers() const;

 private:
  mutable std::once_flag offered_;
  mutable Offers offers_;
};

// Our model through one cache variant: its cache and decode path for reset/prefill/step, and the
// production loop (generate_cached with the variant's attention policy, loop schedule and kernels)
// for generate, with its own logits captured through the step observer.
class ModelTarget final : public DecodeTarget, public RowServing {
 public:
  // `variant` must outlive the target. `model` is shared, not copied.
  ModelTarget(GPT model, const CacheVariant& variant);
  ~ModelTarget() override;

  std::string name() const override { return variant_->name; }
  int64_t context() const override;
  void reset() override;
  at::Tensor prefill(const at::Tensor& ids) override;
  at::Tensor step(const at::Tensor& ids) override;
  Generation generate(const at::Tensor& prompt, int64_t n, const TokenChooser& choose) override;
  const props::SamplerUnderTest& sampler() const override { return sampler_; }
  std::string loop_name() const override { return "production loop"; }

  KVCache& cache() { return *decoder_.cache; }
  const CacheVariant& variant() const { return *variant_; }

  // Serving operations through a RowBatch of this variant's caches (one per row).
  Offers make_offers() const override;
  RowServing& serving() override { return *this; }
  std::vector<int64_t> add_rows(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits) override;
  at::Tensor step_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids) override;
  at::Tensor extend_row(int64_t row, const std::vector<int64_t>& ids) override;
  int64_t fork_row(int64_t row) override;
  void truncate_row(int64_t row, int64_t n) override;
  void release_row(int64_t row) override;
  int set_threads(int n) override;  // LibTorch's intra-op threads (process-wide)
  std::vector<int64_t> reused() const override;
  std::string save_row(int64_t row) override;  // RowBatch::save as bytes (serving.h's to_bytes)
  int64_t restore_row(const std::string& state) override;
  void shift_row(int64_t row, int64_t keep, int64_t discard) override;  // RowBatch::shift
  std::unique_ptr<DecodeTarget> second_instance() const override;      // a ModelTarget of its own
  // speculative.h's decoder over a cache of this variant, the variant's SpeculativeRules.
  SpeculativeAnswer speculate(const SpeculativeRequest& request) override;

 private:
  RowBatch& rows();
  GPT base_;   // the model it was given (a second instance starts from it)
  GPT model_;  // what it computes with: base_, or the variant's model (CacheVariant::model)
  const CacheVariant* variant_;
  Decoder decoder_;
  int64_t fed_ = 0;  // tokens fed since the last reset: the next step's position
  props::SamplerUnderTest sampler_;
  std::unique_ptr<RowBatch> rows_;  // made on first use; `reset` ends it
  std::unique_ptr<SpeculativeDecoder> speculative_;            // made on first use (speculate)
  std::map<std::string, std::unique_ptr<Drafter>> drafters_;   // by draft kind (a model draft by its weights)
};

// Row b = `row` (1, T0) with every id shifted by `stride` x b (mod vocab): a batch of `rows`
// different prompts of one length, (rows, T0).
at::Tensor shifted_rows(const at::Tensor& row, int64_t rows, int64_t vocab, int64_t stride = 1);

}  // namespace tinygpt::checks
