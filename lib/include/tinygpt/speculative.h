// Speculative decoding (docs/SPEC.md section 11): a cheap drafter proposes k tokens, the target
// checks all of them in ONE k + 1 token step through its cache, and a rule decides how many stay.
// The rule keeps the target's output distribution exactly what plain decoding would give:
//
// - exact (rejection sampling): draft x drawn from q is accepted with probability min(1, p(x)/q(x));
//   at the first rejection the token is drawn from norm(max(0, p - q)); when all k are accepted a
//   bonus token is drawn from the target's next distribution. p and q are each model's distribution
//   AFTER the whole sampler pipeline of SPEC 6 (penalty over the history accepted so far,
//   temperature, top-k, top-p). Temperature 0 makes p and q one-hot: exactly greedy decoding.
// - sample-and-match (llama.cpp's server, transformers' prompt lookup): the drafts are greedy, the
//   target samples every position with its own sampler and its own random stream and the round stops
//   at the first sample that differs from the draft. One draw per emitted token, so a seeded run equals
//   plain seeded decoding draw for draw.
//
// Rejected tokens are rolled back from both models' caches (KVCache::truncate, RowBatch::truncate in a
// batch: every layer, a sliding layer's own history included). The verify step sees, at every one of its positions, exactly the keys
// a one-token step there would see (SPEC 4's window past the context, a sliding layer's window), so
// past the window too the result is the plain decoder's.
//
// Each decision of a round is one member of SpeculativeRules, as the sampler's stages are one member
// of SamplerStages: a harness replaces exactly one of them to plant a bug, and the decoder has no
// branch for it. Rows of a batch decode in one RowBatch: one batched verify step a round, each row
// accepting its own count (speculate_rows).
// Leaves out tree drafting (several candidates per position) and draft models with another tokenizer.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tinygpt/attention_policy.h"
#include "tinygpt/gpt.h"
#include "tinygpt/kernels.h"
#include "tinygpt/kv_cache.h"
#include "tinygpt/sampler.h"
#include "tinygpt/serving.h"

namespace tinygpt {

class StepFunction;

enum class AcceptRule { Exact, SampleAndMatch };
const char* accept_rule_name(AcceptRule r);                  // "exact", "sample-and-match"
AcceptRule parse_accept_rule(const std::string& name);      // std::invalid_argument naming the choices

struct SpeculativeSettings {
  int64_t k = 4;  // tokens drafted per round, 1..64
  AcceptRule rule = AcceptRule::Exact;
  SamplingSettings sampling;  // the target's and the draft's pipelines; temperature 0 = greedy
  uint64_t seed = 0;          // the target's stream (acceptance, corrections, bonus); the draft's is its own
  std::vector<int64_t> stop;  // the output ends at the first of these ids (the id included)
  // Throws std::invalid_argument naming the bad setting.
  void validate() const;
};

// What a drafter proposes for one round: up to k ids, the distribution each was drawn from (q: (n, V)
// float32, after the sampler pipeline; undefined for a deterministic drafter: the decoder makes it
// one-hot), the draft's raw logits at each (n, V; undefined without a model) and the uniform each draw
// used (empty for a deterministic drafter).
struct Proposal {
  std::vector<int64_t> ids;
  at::Tensor q;
  at::Tensor logits;
  std::vector<double> u;
};

struct SpeculativeRules;

// Proposes the tokens that follow a sequence. A drafter keeps what it likes between rounds (a model's
// cache); `seq` is always the committed sequence, prompt included, so a drafter that kept tokens the
// target rejected rolls them back itself.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Forget every sequence.
  virtual void reset() = 0;
  // Up to k ids to follow `seq`, drawn with `s` from `gen` (the draft's own stream).
  virtual Proposal propose(const std::vector<int64_t>& seq, int64_t k, const SamplingSettings& s, at::Generator& gen,
                           const SpeculativeRules& rules) = 0;
};

// A model drafting: its own cache (rolling, windows of its own config), fed the committed tokens it has
// not seen and one token per drafted id. `contrary` proposes, k times over, the token the model scores
// LOWEST after the sequence (deterministic, one step a round): with the target's weights a draft that is
// never right at temperature 0 (a round stops at its first rejection, so only the first id is ever
// judged). The target itself drafting (the same weights, a cache of its own) is always right there.
class ModelDrafter final : public Drafter {
 public:
  // `kernels`: how its steps are computed (kernels.h; Decode for the seed's architecture only, else the
  // model's own step). With Decode on the CPU a seed-architecture draft keeps the static cache and takes
  // its one-token steps through the fused step (fused_step.h), as production decoding does: a draft's
  // step must cost a small part of the target's for speculation to pay.
  explicit ModelDrafter(GPT model, bool contrary = false, Kernels kernels = Kernels::Library);
  ~ModelDrafter() override;
  std::string name() const override;
  void reset() override;
  Proposal propose(const std::vector<int64_t>& seq, int64_t k, const SamplingSettings& s, at::Generator& gen,
                   const SpeculativeRules& rules) override;
  KVCache& cache() { return *cache_; }

 private:
  GPT model_;
  bool contrary_;
  Kernels kernels_;
  std::unique_ptr<KVCache> cache_;
  std::unique_ptr<StepFunction> fused_;  // bound to cache_ when its steps are fused; remade with it
  std::vector<int64_t> fed_;  // the ids in the cache, in order (positions from offset_)
  int64_t offset_ = 0;        // ids of the sequence before the first fed one (a prompt longer than the window)
  // The last sequence's prompt, its entries and the logits after it: a new sequence from the same prompt
  // (many draws from one prompt) starts from a copy instead of feeding it again.
  std::vector<int64_t> start_ids_;
  std::unique_ptr<KVCache> start_cache_;
  at::Tensor start_logits_;
};

// Prompt lookup (n-gram drafting, no model): the latest earlier place where the sequence's last n ids
// occur (n from max_n down to min_n), and the ids that followed it there. Deterministic: q is one-hot.
class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(int64_t max_n = 3, int64_t min_n = 1);
  std::string name() const override;
  void reset() override {}
  Proposal propose(const std::vector<int64_t>& seq, int64_t k, const SamplingSettings& s, at::Generator& gen,
                   const SpeculativeRules& rules) override;

 private:
  int64_t max_n_, min_n_;
};

// Given ids as drafts (no model): for a sequence of L ids, the next k of `sequence` from L (fewer at its
// end), the id at index j moved by `shift` ids (mod `vocab`) where j is a multiple of `period`. With the
// target's own greedy run as `sequence`: shift 0 a draft always right at temperature 0, shift 1 period 1
// one never right, shift 1 period p one wrong at every p-th position (rounds accepted in part, their
// rollbacks of every length below k) - each at no cost of its own: what a harness uses to drive the
// verify step and the rollback where the draft is not what it tests. Deterministic: q is one-hot.
class ReplayDrafter final : public Drafter {
 public:
  ReplayDrafter(std::vector<int64_t> sequence, int64_t vocab, int64_t shift = 0, int64_t period = 1);
  std::string name() const override;
  void reset() override {}
  Proposal propose(const std::vector<int64_t>& seq, int64_t k, const SamplingSettings& s, at::Generator& gen,
                   const SpeculativeRules& rules) override;

 private:
  std::vector<int64_t> sequence_;
  int64_t vocab_, shift_, period_;
};

// The decisions of a round, one member each; production_rules() is SPEC 11. A harness replaces one.
struct SpeculativeRules {
  // The target's distribution at a position: logits (V), history (T) the ids before it -> (V) float32.
  // Production: pipeline_probs.
  std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s)> target_probs;
  // What a drafter draws from (production: pipeline_probs) and what the exact rule divides by at draft
  // i (production: the q that draft was drawn from, Proposal::q row i).
  std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s)> draft_probs;
  std::function<at::Tensor(const Proposal& p, int64_t i, const SamplingSettings& s)> ratio_q;
  // The history the target's pipeline sees at draft position i (0-based) of a round: the committed
  // sequence and the drafts before i. Production: seq + drafts[0, i).
  std::function<std::vector<int64_t>(const std::vector<int64_t>& seq, const std::vector<int64_t>& drafts, int64_t i)> history;
  // The exact rule's test for draft x: p_x and q_x its probabilities, u the acceptance uniform.
  // Production: u * q_x < p_x.
  std::function<bool(double p_x, double q_x, double u)> accept;
  // Where draft i's acceptance uniform comes from. Production: the target's own stream (the draft's
  // own draw is Proposal::u[i]; reusing it correlates the test with the draft).
  std::function<double(const Proposal& p, int64_t i, at::Generator& target)> acceptance_uniform;
  // The distribution the token after a rejection is drawn from: p, q (V) -> weights (V) for draw_from.
  // Production: max(0, p - q) (draw_from normalises; all-zero falls back to p).
  std::function<at::Tensor(const at::Tensor& p, const at::Tensor& q)> residual;
  // One id from weights (V) >= 0 with a uniform u in [0, 1): the first index whose cumulative weight
  // exceeds u times the total. Production: draw_from.
  std::function<int64_t(const at::Tensor& weights, double u)> draw_from;
  // Which of the verify step's k + 1 rows the bonus token is drawn from when all k drafts are accepted.
  // Production: k (the position after the last draft).
  std::function<int64_t(int64_t k)> bonus_row;
  // How many drafts a round keeps once the rule accepted `accepted` of `k`. Production: accepted.
  std::function<int64_t(int64_t accepted, int64_t k)> kept;
  // How many of a round's emitted ids survive: the output ends at the first stop id (included) and at
  // the token budget `left`. Production: exactly that.
  std::function<int64_t(const std::vector<int64_t>& emitted, const std::vector<int64_t>& stop, int64_t left)> keep;
  // The verify step's attention: where its k + 1 queries sit and which keys each sees. Production:
  // VerifyPolicy, a one-token step's view at every position.
  std::function<std::shared_ptr<const AttentionPolicy>(const Config& cfg)> verify_policy;
  // How many of the target's newest entries a round drops once `rejected` of them hold no emitted id
  // (the rejected drafts, and any past a stop id or the budget). Production: rejected.
  std::function<int64_t(int64_t rejected)> rollback;
};
const SpeculativeRules& production_rules();

// The verify step's attention: a one-token step's view at every position of a block - the causal order
// inside it and, past the window, SPEC 4's context + 1 keys (BandedPolicy); one query alone is the
// production step (no mask where the window does not cut: the decode kernel's case).
class VerifyPolicy final : public AttentionPolicy {
 public:
  explicit VerifyPolicy(int64_t context) : band_(context + 1) {}
  at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const override;

 private:
  BandedPolicy band_;
};

// The sampler pipeline's distribution (SPEC 6) for one position: logits (V), history (T) int64 ->
// (V) float32 summing to 1. Temperature 0: one-hot at the argmax after the penalty (greedy).
at::Tensor pipeline_probs(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s);
// The walk of an inverse CDF over weights (V): the first index whose cumulative positive weight exceeds
// `target` (the last index with weight when none does). No normalisation: draw_from's part.
int64_t inverse_cdf(const at::Tensor& weights, double target);
// Inverse CDF over weights (V) >= 0: inverse_cdf at u * total. std::invalid_argument without positive mass.
int64_t draw_from(const at::Tensor& weights, double u);
// One uniform in [0, 1) from `gen`.
double uniform(at::Generator& gen);

// k + 1 (or any T) tokens fed through `cache` at positions start .. start+T-1 in one step, every
// position's logits: ids (T) -> (T, V). Each position sees what `policy` lets it (production: a
// one-token step's window at each). `kernels`: the model's own ops, or the decode kernels (kernel_step.h).
at::Tensor verify_step(GPT& model, KVCache& cache, const std::vector<int64_t>& ids, int64_t start, const AttentionPolicy& policy,
                       Kernels kernels = Kernels::Library);

struct SpeculativeRun {
  std::vector<int64_t> ids;  // the new ids (at most n; ends at a stop id)
  at::Tensor logits;         // (m, V) float32: the target's logits each new id was chosen from
  int64_t rounds = 0, drafted = 0, accepted = 0;  // drafts judged and kept by the rule (a stop or the budget may end the output first)
  std::vector<int64_t> accepted_per_round;        // drafts kept in each round
  bool stopped = false;                     // ended at a stop id
  // Plain greedy steps after the speculative ones, on the same target cache (SpeculativeDecoder::run's
  // then_plain): their logits (t, V) and ids. What a rollback left behind shows here.
  at::Tensor then_logits;
  std::vector<int64_t> then_ids;
  double acceptance() const { return drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0; }
  // Tokens per round (accepted drafts + the token each round adds).
  double mean_accepted_length() const { return rounds ? static_cast<double>(ids.size()) / static_cast<double>(rounds) : 0.0; }
};

// One sequence decoded speculatively through a target model and its cache.
class SpeculativeDecoder {
 public:
  // `cache` must offer truncate (KVCache::row_ops_unsupported() == ""): std::invalid_argument otherwise.
  // `kernels`: how the verify steps are computed (the decode kernels take up to kMatvecMaxRows rows).
  SpeculativeDecoder(GPT target, std::unique_ptr<KVCache> cache, const SpeculativeRules& rules = production_rules(),
                     Kernels kernels = Kernels::Library);
  // A new sequence from `prompt` (its last `context` ids are fed; the penalty sees all of them): n new
  // ids, then `then_plain` greedy one-token steps on the same cache. Throws std::invalid_argument on a
  // bad prompt, n < 1 or bad settings.
  SpeculativeRun run(const std::vector<int64_t>& prompt, int64_t n, Drafter& drafter, const SpeculativeSettings& s,
                     int64_t then_plain = 0);
  KVCache& cache() { return *cache_; }
  // Ids whose entries the cache holds, in order (all but the newest id of the sequence).
  const std::vector<int64_t>& fed() const { return fed_; }
  int64_t offset() const { return offset_; }

 private:
  GPT model_;
  std::unique_ptr<KVCache> cache_;
  const SpeculativeRules& rules_;
  Kernels kernels_;
  std::vector<int64_t> fed_;
  int64_t offset_ = 0;
  // The last run's prompt entries: a run from the same prompt starts from a copy (KVCache::clone).
  std::vector<int64_t> prefilled_ids_;
  std::unique_ptr<KVCache> prefilled_;
};

// Rows of a batch decoded speculatively together in one RowBatch (serving.h), as a server's slots do:
// every round, each unfinished row's block (its newest id and its drafts, k of them or fewer) goes
// through ONE batched verify step (RowBatch::verify, blocks padded to the longest), each row accepts its
// own count and rolls back its own rejected drafts (RowBatch::truncate), so the rows' lengths part after
// the first round. Row b draws with seed s.seed + b: its ids are a SpeculativeDecoder's for that row
// alone. `make_drafter` gives each row a drafter of its own. The rows are added to `batch` (RowBatch::add)
// and left in it. Throws std::invalid_argument for bad prompts or settings, or rows that cannot roll back.
std::vector<SpeculativeRun> speculate_rows(RowBatch& batch, const std::function<std::unique_ptr<Drafter>()>& make_drafter,
                                           const std::vector<std::vector<int64_t>>& prompts, int64_t n, const SpeculativeSettings& s,
                                           const SpeculativeRules& rules = production_rules());

}  // namespace tinygpt
