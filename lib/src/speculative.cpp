#include "tinygpt/speculative.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "tinygpt/config.h"
#include "tinygpt/fused_step.h"
#include "tinygpt/kernel_step.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt {

const char* accept_rule_name(AcceptRule r) { return r == AcceptRule::Exact ? "exact" : "sample-and-match"; }

AcceptRule parse_accept_rule(const std::string& name) {
  if (name == "exact") return AcceptRule::Exact;
  if (name == "sample-and-match") return AcceptRule::SampleAndMatch;
  throw std::invalid_argument("unknown acceptance rule '" + name + "' (exact, sample-and-match)");
}

void SpeculativeSettings::validate() const {
  if (k < 1 || k > 64) throw std::invalid_argument("speculative: k must be in [1, 64], got " + std::to_string(k));
  sampling.validate();
  for (int64_t id : stop)
    if (id < 0) throw std::invalid_argument("speculative: a stop id must be >= 0, got " + std::to_string(id));
}

namespace {

at::Tensor ids_tensor(const std::vector<int64_t>& ids, c10::Device dev) {
  return at::tensor(ids, at::kLong).to(dev);  // (T)
}

// The sequence's ids before draft i of a round, as the pipeline's history (1, T).
at::Tensor history_of(const std::vector<int64_t>& h, c10::Device dev) { return ids_tensor(h, dev).unsqueeze(0); }

// p[x] of a (V) tensor, read in place where it lies in CPU memory.
double at_index(const at::Tensor& p, int64_t x) {
  if (p.device().is_cpu() && p.scalar_type() == at::kFloat && p.is_contiguous()) return p.data_ptr<float>()[x];
  return p[x].item<double>();
}

at::Tensor one_hot_row(int64_t id, int64_t V, const at::TensorOptions& opts) {
  at::Tensor p = at::zeros({V}, opts.dtype(at::kFloat));
  p[id] = 1.0;
  return p;
}

}  // namespace

at::Tensor VerifyPolicy::mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const {
  return tq == 1 ? AttentionPolicy::mask(tq, tk, opts, window) : band_.mask(tq, tk, opts, window);
}

at::Tensor pipeline_probs(const at::Tensor& logits, const at::Tensor& history, const SamplingSettings& s) {
  const at::Tensor l = logits.reshape({1, -1});  // (1, V)
  const at::Tensor h = history.defined() && history.numel() > 0 ? history.reshape({1, -1}) : at::Tensor();
  if (s.temperature == 0) {
    if (s.penalty == 1.0 || !h.defined()) return one_hot_row(l.argmax(-1).item<int64_t>(), l.size(1), l.options());  // greedy(): the argmax
    const at::Tensor scores = apply_penalty(checked_scores(l, h), h, s.penalty);
    return one_hot_row(scores.argmax(-1).item<int64_t>(), l.size(1), l.options());
  }
  return filtered_probs(l, h, s).reshape({-1});  // (V)
}

int64_t inverse_cdf(const at::Tensor& weights, double target) {
  const at::Tensor w = weights.reshape({-1}).to(at::kCPU, at::kDouble).contiguous();
  const double* p = w.data_ptr<double>();
  double cum = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < w.numel(); ++i) {
    if (p[i] <= 0) continue;
    cum += p[i];
    last = i;
    if (cum > target) return i;
  }
  return last;  // the target at the very top (rounding): the last id with weight
}

int64_t draw_from(const at::Tensor& weights, double u) {
  const double total = weights.to(at::kDouble).sum().item<double>();
  if (!(total > 0)) throw std::invalid_argument("draw_from: the weights have no positive mass");
  return inverse_cdf(weights, u * total);
}

double uniform(at::Generator& gen) {
  return at::rand({1}, gen, at::TensorOptions().dtype(at::kDouble)).item<double>();
}

at::Tensor verify_step(GPT& model, KVCache& cache, const std::vector<int64_t>& ids, int64_t start, const AttentionPolicy& policy,
                       Kernels kernels) {
  const c10::Device dev = model->emb->weight.device();
  const at::Tensor idx = ids_tensor(ids, dev).unsqueeze(0);                            // (1, T)
  return step_every_with(*model, idx, cache, start, policy, kernels).select(0, 0);  // (T, V)
}

const SpeculativeRules& production_rules() {
  static const SpeculativeRules rules = [] {
    SpeculativeRules r;
    r.target_probs = pipeline_probs;
    r.draft_probs = pipeline_probs;
    r.ratio_q = [](const Proposal& p, int64_t i, const SamplingSettings&) { return p.q.select(0, i); };
    r.history = [](const std::vector<int64_t>& seq, const std::vector<int64_t>& drafts, int64_t i) {
      std::vector<int64_t> h = seq;
      h.insert(h.end(), drafts.begin(), drafts.begin() + i);
      return h;
    };
    r.accept = [](double p_x, double q_x, double u) { return u * q_x < p_x; };
    r.acceptance_uniform = [](const Proposal&, int64_t, at::Generator& target) { return uniform(target); };
    r.residual = [](const at::Tensor& p, const at::Tensor& q) {
      const at::Tensor w = (p - q).clamp_min(0);  // (V)
      return w.sum().item<double>() > 0 ? w : p;  // p == q: a rejection has probability 0; p is the answer
    };
    r.draw_from = draw_from;
    r.bonus_row = [](int64_t k) { return k; };
    r.kept = [](int64_t accepted, int64_t) { return accepted; };
    r.keep = [](const std::vector<int64_t>& emitted, const std::vector<int64_t>& stop, int64_t left) {
      int64_t m = std::min<int64_t>(static_cast<int64_t>(emitted.size()), left);
      for (int64_t i = 0; i < m; ++i)
        if (std::find(stop.begin(), stop.end(), emitted[static_cast<size_t>(i)]) != stop.end()) return i + 1;
      return m;
    };
    r.verify_policy = [](const Config& cfg) -> std::shared_ptr<const AttentionPolicy> {
      return std::make_shared<VerifyPolicy>(cfg.context);
    };
    r.rollback = [](int64_t rejected) { return rejected; };
    return r;
  }();
  return rules;
}

// --- drafters ---

namespace {
// A seed-architecture model on the CPU in float32 under the decode kernels: its one-token steps can be fused.
bool fusable(GPT& m, Kernels k) {
  const at::Tensor& w = m->emb->weight;
  return k == Kernels::Decode && m->seed_architecture() && w.device().is_cpu() && w.scalar_type() == at::kFloat;
}
}  // namespace

ModelDrafter::ModelDrafter(GPT model, bool contrary, Kernels kernels) : model_(std::move(model)), contrary_(contrary), kernels_(kernels) {
  if (fusable(model_, kernels_)) cache_ = std::make_unique<StaticKVCache>(model_->config());
  else cache_ = std::make_unique<RollingKVCache>(model_->config());
}

ModelDrafter::~ModelDrafter() = default;

std::string ModelDrafter::name() const { return contrary_ ? "contrary" : "model"; }

void ModelDrafter::reset() {
  cache_->reset();
  fed_.clear();
  offset_ = 0;
}

Proposal ModelDrafter::propose(const std::vector<int64_t>& seq, int64_t k, const SamplingSettings& s, at::Generator& gen,
                               const SpeculativeRules& rules) {
  const Config& cfg = model_->config();
  const c10::Device dev = model_->emb->weight.device();
  const VerifyPolicy window(cfg.context);
  if (fed_.empty()) offset_ = std::max<int64_t>(0, static_cast<int64_t>(seq.size()) - cfg.context);
  const int64_t have = static_cast<int64_t>(seq.size()) - offset_;  // ids of seq from the first fed one
  if (have < 1) throw std::invalid_argument("ModelDrafter: the sequence is shorter than what was fed");
  // The entries that still match the sequence (never all of it: the newest id's logits are the draft's start).
  int64_t common = 0;
  const int64_t n_fed = static_cast<int64_t>(fed_.size());
  while (common < n_fed && common < have - 1 && fed_[static_cast<size_t>(common)] == seq[static_cast<size_t>(offset_ + common)]) ++common;
  if (common < n_fed) {
    cache_->truncate(n_fed - common);
    fed_.resize(static_cast<size_t>(common));
  }
  const std::vector<int64_t> chunk(seq.begin() + offset_ + common, seq.end());
  at::Tensor logits;  // (V): the draft's logits after the sequence
  if (n_fed == 0 && start_cache_ && chunk == start_ids_) {  // the prompt of the last sequence again: its entries
    cache_ = start_cache_->clone();
    fused_.reset();
    logits = start_logits_;
  } else {
    logits = verify_step(model_, *cache_, chunk, common, window, kernels_);  // (T, V)
    logits = logits.select(0, logits.size(0) - 1);
    if (n_fed == 0) start_ids_ = chunk, start_cache_ = cache_->clone(), start_logits_ = logits;
  }
  fed_.insert(fed_.end(), chunk.begin(), chunk.end());

  Proposal p;
  if (contrary_) {
    p.ids.assign(static_cast<size_t>(k), logits.argmin().item<int64_t>());
    p.logits = logits.unsqueeze(0).expand({k, logits.size(0)}).contiguous();  // (k, V)
    return p;
  }
  std::vector<at::Tensor> qs, ls;
  std::vector<int64_t> hist = seq;
  for (int64_t i = 0; i < k; ++i) {
    const at::Tensor q = rules.draft_probs(logits, s.penalty != 1.0 ? history_of(hist, dev) : at::Tensor(), s);  // (V)
    const double u = uniform(gen);
    const int64_t x = rules.draw_from(q, u);
    qs.push_back(q);
    ls.push_back(logits);
    p.u.push_back(u);
    p.ids.push_back(x);
    hist.push_back(x);
    if (i + 1 < k) {
      const int64_t pos = static_cast<int64_t>(fed_.size());
      if (fusable(model_, kernels_)) {  // the production decode step, on this draft's static cache
        if (!fused_) fused_ = std::make_unique<FusedCpuStep>(static_cast<StaticKVCache&>(*cache_));
        const at::Tensor idx = at::tensor(std::vector<int64_t>{x}, at::kLong).view({1, 1});
        logits = (*fused_)(*model_, idx, *cache_, pos, kernels_).select(0, 0);  // (V)
      } else {
        logits = verify_step(model_, *cache_, {x}, pos, window, kernels_).select(0, 0);  // (V)
      }
      fed_.push_back(x);
    }
  }
  p.q = at::stack(qs);       // (k, V)
  p.logits = at::stack(ls);  // (k, V)
  return p;
}

NgramDrafter::NgramDrafter(int64_t max_n, int64_t min_n) : max_n_(max_n), min_n_(min_n) {
  if (min_n < 1 || max_n < min_n) throw std::invalid_argument("NgramDrafter: need 1 <= min_n <= max_n");
}

std::string NgramDrafter::name() const { return "ngram"; }

Proposal NgramDrafter::propose(const std::vector<int64_t>& seq, int64_t k, const SamplingSettings&, at::Generator&,
                               const SpeculativeRules&) {
  Proposal p;
  const int64_t L = static_cast<int64_t>(seq.size());
  for (int64_t n = std::min(max_n_, L - 1); n >= min_n_; --n) {
    // The latest earlier occurrence of the last n ids (not the suffix itself), and what followed it.
    for (int64_t start = L - n - 1; start >= 0; --start) {
      if (!std::equal(seq.begin() + start, seq.begin() + start + n, seq.end() - n)) continue;
      for (int64_t j = start + n; j < L && static_cast<int64_t>(p.ids.size()) < k; ++j) p.ids.push_back(seq[static_cast<size_t>(j)]);
      return p;
    }
  }
  return p;  // no match: the round is a plain step (the bonus token alone)
}

ReplayDrafter::ReplayDrafter(std::vector<int64_t> sequence, int64_t vocab, int64_t shift, int64_t period)
    : sequence_(std::move(sequence)), vocab_(vocab), shift_(shift), period_(period) {
  if (vocab < 1) throw std::invalid_argument("ReplayDrafter: the vocabulary must hold an id");
  if (shift < 0 || shift >= vocab) throw std::invalid_argument("ReplayDrafter: the shift must be in [0, vocab)");
  if (period < 1) throw std::invalid_argument("ReplayDrafter: the period must be >= 1");
  for (int64_t id : sequence_)
    if (id < 0 || id >= vocab) throw std::invalid_argument("ReplayDrafter: id " + std::to_string(id) + " outside the vocabulary");
}

std::string ReplayDrafter::name() const {
  if (shift_ == 0) return "replay";
  return "replay+" + std::to_string(shift_) + (period_ > 1 ? " every " + std::to_string(period_) : "");
}

Proposal ReplayDrafter::propose(const std::vector<int64_t>& seq, int64_t k, const SamplingSettings&, at::Generator&,
                                const SpeculativeRules&) {
  Proposal p;
  for (size_t j = seq.size(); j < sequence_.size() && static_cast<int64_t>(p.ids.size()) < k; ++j)
    p.ids.push_back(j % static_cast<size_t>(period_) == 0 ? (sequence_[j] + shift_) % vocab_ : sequence_[j]);
  return p;  // past the sequence's end: no drafts (the round is a plain step)
}

// --- the decoder ---

namespace {

// One sequence's state across rounds: the committed ids (prompt first), the run so far and the logits
// each new id was chosen from, the target's stream and the draft's.
struct Sequence {
  Sequence(const std::vector<int64_t>& prompt, const SpeculativeSettings& s, c10::Device dev)
      : seq(prompt), target_gen(make_generator(dev, s.seed)), draft_gen(make_generator(dev, s.seed ^ 0x9E3779B97F4A7C15ull)) {}
  std::vector<int64_t> seq;
  SpeculativeRun out;
  std::vector<at::Tensor> rows;  // (V) per new id
  at::Generator target_gen, draft_gen;
  bool done(int64_t n) const { return static_cast<int64_t>(out.ids.size()) >= n || out.stopped; }
};

void check_request(const Config& cfg, const std::vector<int64_t>& prompt, int64_t n, const SpeculativeSettings& s) {
  s.validate();
  if (prompt.empty()) throw std::invalid_argument("speculative: the prompt is empty");
  for (int64_t id : prompt)
    if (id < 0 || id >= cfg.vocab_size)
      throw std::invalid_argument("speculative: prompt id " + std::to_string(id) + " outside [0, " + std::to_string(cfg.vocab_size) + ")");
  if (n < 1) throw std::invalid_argument("speculative: n must be >= 1");
}

// The drafter's proposal for the next round, at most k ids, q one-hot where the draft is deterministic.
Proposal propose(Drafter& d, Sequence& q, const SpeculativeSettings& s, const SpeculativeRules& rules, int64_t V, c10::Device dev) {
  SamplingSettings drafting = s.sampling;
  if (s.rule == AcceptRule::SampleAndMatch) drafting.temperature = 0;  // greedy drafts; the target samples
  Proposal prop = d.propose(q.seq, s.k, drafting, q.draft_gen, rules);
  const int64_t kk = std::min<int64_t>(static_cast<int64_t>(prop.ids.size()), s.k);
  prop.ids.resize(static_cast<size_t>(kk));
  if (!prop.q.defined() && kk > 0) {  // a deterministic draft: one-hot q
    prop.q = at::zeros({kk, V}, at::TensorOptions().dtype(at::kFloat).device(dev));
    for (int64_t i = 0; i < kk; ++i) prop.q[i][prop.ids[static_cast<size_t>(i)]] = 1.0;
  }
  return prop;
}

// The verify step's block: the newest committed id (its entry not yet in the cache), then the drafts.
std::vector<int64_t> block_of(const Sequence& q, const Proposal& prop) {
  std::vector<int64_t> block = {q.seq.back()};
  block.insert(block.end(), prop.ids.begin(), prop.ids.end());
  return block;
}

// The rule over the verify step's logits L (kk + 1, V): how many drafts stand, then the one id the target
// adds; the emitted ids are committed to `q` (cut at a stop id and at the budget n). Returns how many of
// the block's entries hold no emitted id but the newest (what the round rolls back).
int64_t decide(Sequence& q, const Proposal& prop, const at::Tensor& L, int64_t n, const SpeculativeSettings& s,
               const SpeculativeRules& rules, c10::Device dev) {
  const int64_t kk = static_cast<int64_t>(prop.ids.size());
  // The history each position's pipeline sees (only a penalty reads it).
  auto hist = [&](int64_t i) { return s.sampling.penalty != 1.0 ? history_of(rules.history(q.seq, prop.ids, i), dev) : at::Tensor(); };
  const bool exact = s.rule == AcceptRule::Exact;
  auto p_at = [&](int64_t row) { return rules.target_probs(L.select(0, row), hist(row), s.sampling); };  // (V)
  // The target's own id at a row: drawn from p (exact) or by its sampler (sample-and-match).
  auto target_id = [&](int64_t row) {
    return exact ? rules.draw_from(p_at(row), uniform(q.target_gen))
                 : pick(L.select(0, row).unsqueeze(0), s.sampling, hist(row), q.target_gen).item<int64_t>();
  };
  int64_t accepted = 0, next = -1, next_row = -1;
  for (; accepted < kk; ++accepted) {
    const int64_t x = prop.ids[static_cast<size_t>(accepted)];
    if (exact) {
      const at::Tensor p = p_at(accepted);
      const at::Tensor qx = rules.ratio_q(prop, accepted, s.sampling);  // (V)
      const double u = rules.acceptance_uniform(prop, accepted, q.target_gen);
      if (!rules.accept(at_index(p, x), at_index(qx, x), u)) break;
    } else if (const int64_t t = target_id(accepted); t != x) {
      next = t, next_row = accepted;
      break;
    }
  }
  const int64_t j = std::clamp<int64_t>(rules.kept(accepted, kk), 0, kk);
  if (j != accepted) next = -1;  // the drawn token (sample-and-match) belonged to another position
  if (next < 0) {
    // After a rejection: the residual (exact) or the target's own draw; every draft standing: the bonus id.
    next_row = j < kk ? j : std::clamp<int64_t>(rules.bonus_row(kk), 0, kk);
    next = j < kk && exact ? rules.draw_from(rules.residual(p_at(j), rules.ratio_q(prop, j, s.sampling)), uniform(q.target_gen))
                           : target_id(next_row);
  }
  std::vector<int64_t> emitted(prop.ids.begin(), prop.ids.begin() + j);
  emitted.push_back(next);
  const int64_t m = rules.keep(emitted, s.stop, n - static_cast<int64_t>(q.out.ids.size()));
  emitted.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) q.rows.push_back(L.select(0, i < j ? i : next_row));
  ++q.out.rounds;
  q.out.drafted += kk;
  q.out.accepted += j;  // judged by the rule (a budget or a stop may end the output before them)
  q.out.accepted_per_round.push_back(j);
  for (int64_t id : emitted) {
    q.seq.push_back(id);
    q.out.ids.push_back(id);
    if (std::find(s.stop.begin(), s.stop.end(), id) != s.stop.end()) q.out.stopped = true;
  }
  return kk + 1 - m;  // the block held kk + 1 entries; m new ids stay, all but the newest fed
}

void finish(Sequence& q) { q.out.logits = q.rows.empty() ? at::Tensor() : at::stack(q.rows).to(at::kFloat); }  // (m, V)

}  // namespace

SpeculativeDecoder::SpeculativeDecoder(GPT target, std::unique_ptr<KVCache> cache, const SpeculativeRules& rules, Kernels kernels)
    : model_(std::move(target)), cache_(std::move(cache)), rules_(rules), kernels_(kernels) {
  if (!cache_) throw std::invalid_argument("SpeculativeDecoder: no cache");
  const std::string why = cache_->row_ops_unsupported();
  if (!why.empty()) throw std::invalid_argument("SpeculativeDecoder: the cache cannot roll back rejected drafts: " + why);
}

SpeculativeRun SpeculativeDecoder::run(const std::vector<int64_t>& prompt, int64_t n, Drafter& drafter, const SpeculativeSettings& s,
                                       int64_t then_plain) {
  const Config& cfg = model_->config();
  check_request(cfg, prompt, n, s);
  if (then_plain < 0) throw std::invalid_argument("speculative: then_plain must be >= 0");
  const c10::Device dev = model_->emb->weight.device();
  const std::shared_ptr<const AttentionPolicy> policy = rules_.verify_policy(cfg);

  drafter.reset();
  Sequence q(prompt, s, dev);
  offset_ = std::max<int64_t>(0, static_cast<int64_t>(q.seq.size()) - cfg.context);
  fed_.assign(q.seq.begin() + offset_, q.seq.end() - 1);  // the window's ids but the newest
  if (prefilled_ && fed_ == prefilled_ids_) {  // the prompt of the last run again: its entries, copied
    cache_ = prefilled_->clone();
  } else {
    cache_->reset();
    if (!fed_.empty()) verify_step(model_, *cache_, fed_, 0, *policy, kernels_);
    prefilled_ = cache_->clone(), prefilled_ids_ = fed_;
  }
  while (!q.done(n)) {
    const Proposal prop = propose(drafter, q, s, rules_, cfg.vocab_size, dev);
    const at::Tensor L = verify_step(model_, *cache_, block_of(q, prop), static_cast<int64_t>(fed_.size()), *policy, kernels_);  // (kk + 1, V)
    cache_->truncate(rules_.rollback(decide(q, prop, L, n, s, rules_, dev)));
    fed_.assign(q.seq.begin() + offset_, q.seq.end() - 1);
  }
  finish(q);

  // Plain greedy steps on the same cache: what a rollback left behind shows in their logits.
  std::vector<at::Tensor> then;
  for (int64_t t = 0; t < then_plain; ++t) {
    const at::Tensor l = verify_step(model_, *cache_, {q.seq.back()}, static_cast<int64_t>(fed_.size()), *policy, kernels_).select(0, 0);  // (V)
    fed_.push_back(q.seq.back());
    then.push_back(l);
    const int64_t x = l.argmax().item<int64_t>();
    q.seq.push_back(x);
    q.out.then_ids.push_back(x);
  }
  if (!then.empty()) q.out.then_logits = at::stack(then).to(at::kFloat);  // (t, V)
  return std::move(q.out);
}

std::vector<SpeculativeRun> speculate_rows(RowBatch& batch, const std::function<std::unique_ptr<Drafter>()>& make_drafter,
                                           const std::vector<std::vector<int64_t>>& prompts, int64_t n, const SpeculativeSettings& s,
                                           const SpeculativeRules& rules) {
  const Config& cfg = batch.config();
  if (prompts.empty()) throw std::invalid_argument("speculative: no prompts");
  for (const auto& p : prompts) check_request(cfg, p, n, s);
  const std::string why = batch.unsupported();
  if (!why.empty()) throw std::invalid_argument("speculative: the rows' caches cannot roll back rejected drafts: " + why);
  const std::shared_ptr<const AttentionPolicy> policy = rules.verify_policy(cfg);

  // Every row prefilled together; its newest id's entry is dropped again: each round's block starts with it.
  at::Tensor first;  // (B, V), unused: a round computes the newest id's logits with its drafts
  const std::vector<int64_t> rows = batch.add(prompts, first);
  const c10::Device dev = batch.device();
  std::vector<Sequence> seqs;
  std::vector<std::unique_ptr<Drafter>> drafters;
  for (size_t b = 0; b < prompts.size(); ++b) {
    batch.truncate(rows[b], 1);
    SpeculativeSettings row = s;
    row.seed = s.seed + b;
    seqs.emplace_back(prompts[b], row, dev);
    drafters.push_back(make_drafter());
    drafters.back()->reset();
  }
  while (true) {
    std::vector<size_t> live;
    for (size_t b = 0; b < seqs.size(); ++b)
      if (!seqs[b].done(n)) live.push_back(b);
    if (live.empty()) break;
    std::vector<Proposal> props;
    std::vector<int64_t> ids;
    std::vector<std::vector<int64_t>> blocks;
    for (size_t b : live) {
      props.push_back(propose(*drafters[b], seqs[b], s, rules, cfg.vocab_size, dev));
      ids.push_back(rows[b]);
      blocks.push_back(block_of(seqs[b], props.back()));
    }
    const std::vector<at::Tensor> L = batch.verify(ids, blocks, *policy);  // per live row (kk + 1, V)
    for (size_t i = 0; i < live.size(); ++i) {
      const size_t b = live[i];
      batch.truncate(rows[b], rules.rollback(decide(seqs[b], props[i], L[i], n, s, rules, dev)));  // each row its own count
    }
  }
  std::vector<SpeculativeRun> out;
  for (auto& q : seqs) finish(q), out.push_back(std::move(q.out));
  return out;
}

}  // namespace tinygpt
