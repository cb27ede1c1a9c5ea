// An engine in any language as a decode target: reset, prefill and step as protocol requests, its
// sampler through `sample`. Answers are judged here: a wrong shape, a non-finite logit or an
// `ok: false` answer to a valid request throws WrongAnswer (the check that sent it fails with it);
// an engine that cannot be talked to throws EngineUnusable (engine_process.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine_process.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/repro.h"
#include "tinygpt/checks/target.h"

namespace tinygpt::checks {

// A wrong answer to a valid request: the engine is wrong, so the check that sent it fails.
struct WrongAnswer : CheckFailure {
  using CheckFailure::CheckFailure;
};

// The highest protocol this suite speaks (docs/protocol.md); hello offers it, the engine answers its own.
inline constexpr int kProtocol = 3;

// The answers' contents, decoded and judged: each throws WrongAnswer naming what is wrong (kept
// apart from the process, so the protocol fuzz target runs them on hostile answers).
// "logits": (rows, vocab) float, every entry a finite number.
at::Tensor answer_logits(const nlohmann::json& answer, int64_t rows, int64_t vocab, const std::string& op);
// prefill's "rows": the ids of `n` new rows.
std::vector<int64_t> answer_rows(const nlohmann::json& answer, size_t n);
// The optional "reused" of a prefill answer: entries per new row served from the engine's cache
// (n of them, each in [0, prompt length]); empty when the answer does not say.
std::vector<int64_t> answer_reused(const nlohmann::json& answer, const std::vector<std::vector<int64_t>>& prompts);
// fork's "row": one integer id.
int64_t answer_row(const nlohmann::json& answer, const std::string& op);
// threads' "before": a positive thread count.
int answer_before(const nlohmann::json& answer);
// The "state" of a save answer: a non-empty string (the engine's opaque value, sent back as it came).
std::string answer_state(const nlohmann::json& answer);
// sample's "ids": `rows` rows of `n` ids each in [0, vocab).
std::vector<std::vector<int64_t>> answer_sample_ids(const nlohmann::json& answer, size_t rows, int64_t n, int64_t vocab);
// generate's "results": one per sequence asked for (every request's copies, each once), each with `n`
// ids in [0, vocab) and what they were chosen from: "logits" (n rows of vocab finite numbers) or "top"
// (n lists of [id, log-probability] pairs, at least one each, log-probabilities finite and <= 1e-3).
std::vector<ServedResult> answer_served(const nlohmann::json& answer, const std::vector<ServedRequest>& requests, int64_t vocab);
// Throws EngineUnusable when hello's fields have the wrong types or name a protocol outside 1 to kProtocol.
// A 'speculate' answer, each field of the type and size docs/protocol.md gives it: ids (exactly n
// unless a stop id ended them), their logits (or their top-N log-probabilities), the counts, and the
// plain steps after them.
SpeculativeAnswer answer_speculated(const nlohmann::json& answer, const SpeculativeRequest& request, int64_t vocab);
void check_hello(const nlohmann::json& hello);

class RemoteTarget final : public DecodeTarget, public RowServing {
 public:
  // `hello` the engine's answer to hello (name, deviations).
  RemoteTarget(EngineProcess& p, const nlohmann::json& hello, int64_t vocab, int64_t context);

  std::string name() const override { return name_; }
  int64_t context() const override { return context_; }
  void reset() override;
  at::Tensor prefill(const at::Tensor& ids) override;
  at::Tensor step(const at::Tensor& ids) override;
  // Where hello said "sampler": false, the offer says so (Offers::no_sampler) and this throws.
  const props::SamplerUnderTest& sampler() const override;
  std::string loop_name() const override { return "engine"; }

  // Protocols 2 and 3: rows by id. An operation is supported when hello's protocol has it and its
  // "operations" list names it (extend is protocol 3's).
  RowServing& serving() override;
  std::vector<int64_t> add_rows(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits) override;
  at::Tensor step_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids) override;
  at::Tensor extend_row(int64_t row, const std::vector<int64_t>& ids) override;
  int64_t fork_row(int64_t row) override;
  void truncate_row(int64_t row, int64_t n) override;
  void release_row(int64_t row) override;
  int set_threads(int n) override;
  std::vector<int64_t> reused() const override { return reused_; }
  std::string save_row(int64_t row) override;
  int64_t restore_row(const std::string& state) override;
  void shift_row(int64_t row, int64_t keep, int64_t discard) override;
  std::vector<ServedResult> serve(const std::vector<ServedRequest>& requests) override;
  // Op "speculate": the engine's own draft-and-verify decoding (hello's "speculate" lists the draft
  // kinds and acceptance rules it offers). A "model" draft goes as a file the writer set below makes.
  SpeculativeAnswer speculate(const SpeculativeRequest& request) override;
  Generation seeded(const at::Tensor& prompt, int64_t n, const SamplingSettings& s, uint64_t seed) override;
  // Writes a draft model in the engine's format and returns the path the engine loads (called once per
  // draft model; conform writes it beside the target's weights).
  using DraftWriter = std::function<std::string(GPT& draft)>;
  void set_draft_writer(DraftWriter w) { draft_writer_ = std::move(w); }
  int64_t requests() const { return p_.requests(); }
  // A second process of the same engine (started, greeted and loaded by `spawn` when asked): where
  // save-restore restores its states into a fresh context. Set before offers() is first asked; without a
  // spawn the offer says there is none.
  using Spawn = std::function<std::unique_ptr<DecodeTarget>()>;
  void set_spawn(Spawn spawn) { spawn_ = std::move(spawn); }
  std::unique_ptr<DecodeTarget> second_instance() const override;
  // Keeps what the engine's process belongs to alive as long as this target (a spawned instance's).
  void own(std::shared_ptr<void> owner) { owner_ = std::move(owner); }

  // Every request from now on, with what of its answer later requests name, kept in `t` (nullptr: none).
  void record(Transcript* t) { transcript_ = t; }

  // Set once the engine could not be talked to: every later request throws it again.
  const std::optional<std::string>& unusable() const { return unusable_; }

 protected:
  // From its hello: the operations it names (by protocol), the draft kinds and rules it speculates
  // with, its sampler, rows or whole requests only, max_rows, its deviations; a second instance where
  // a spawn is set.
  Offers make_offers() const override;

 private:
  // "" when the hello offers `op`, else why not.
  std::string why_not(Op op) const;
  nlohmann::json ok(const nlohmann::json& req);
  at::Tensor logits(const nlohmann::json& answer, int64_t rows, const std::string& op) const {
    return answer_logits(answer, rows, vocab_, op);
  }
  at::Tensor pick(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s);
  // `sample` with "rows": each row its own settings and seed (op "row-sampling"): (B, n) ids.
  at::Tensor pick_rows(const at::Tensor& logits, const at::Tensor& history, const std::vector<RowSampling>& rows, int64_t n);

  EngineProcess& p_;
  Transcript* transcript_ = nullptr;
  std::shared_ptr<void> owner_;
  Spawn spawn_;
  std::string name_;
  std::vector<std::string> deviations_;
  int64_t vocab_, context_;
  std::optional<std::string> unusable_;
  std::vector<int64_t> reused_;  // the last prefill's "reused", when it said
  std::optional<int64_t> max_rows_;  // hello's "max_rows"; none: it named no limit
  std::vector<std::string> drafts_, rules_;  // hello's "speculate": the draft kinds and rules it offers
  DraftWriter draft_writer_;
  std::map<const void*, std::string> draft_files_;  // a draft model's file, by its weights
  bool has_sampler_ = true;
  bool takes_rows_ = true;  // hello's "rows": false says the engine takes whole requests only
  int protocol_ = 1;
  std::vector<std::string> operations_;
  props::SamplerUnderTest sampler_;
};

// (B, T) int64 ids as [[...], ...].
nlohmann::json ids_json(const at::Tensor& ids);

}  // namespace tinygpt::checks
