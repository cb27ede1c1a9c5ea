// Speculative decoding's faults: each a bug engines shipped in a draft-and-verify decoder, planted as
// one changed member of SpeculativeRules (speculative.h) - one decision of a round - on the production
// path otherwise. Each names the rows that must catch it; the distribution's faults are the exact
// rule's negative controls, which only spec-distribution's chi-square sees (at temperature 0 every one
// of them is still greedy decoding).
#include <ATen/ATen.h>

#include <limits>

#include "fault.h"

namespace tinygpt::checks::faults {

namespace {

// The production path (fault.h's `fault`: the static cache, the decode kernels, the fused step for plain
// steps) with one rule of a speculative round changed; its run is the rows that must catch it and the
// shared greedy run.
CacheVariant spec_fault(std::string name, std::string description, std::vector<std::string> expected,
                        const std::function<void(SpeculativeRules&)>& change) {
  CacheVariant v = fault(std::move(name), std::move(description), expected);
  v.checks = std::move(expected);
  v.checks.insert(v.checks.begin(), check::kTokens);
  auto rules = std::make_shared<SpeculativeRules>(production_rules());
  change(*rules);
  v.speculative = std::move(rules);
  return v;
}

at::Tensor raw_softmax(const at::Tensor& logits) { return logits.to(at::kFloat).softmax(-1); }

}  // namespace

void register_speculative_faults(FaultFile& r) {
  using check::kSpecCache;
  using check::kSpecDistribution;
  using check::kSpecGreedy;
  using check::kSpecStops;
  // The verify step's k + 1 queries without the causal part of their mask: each position sees the drafts
  // after it (the seed's top-left mask bug, the other way round: a mask dropped where T > 1 was assumed
  // to be a prefill only).
  class VerifyWithoutCausalMask final : public AttentionPolicy {
   public:
    at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const override {
      if (tq == 1) return AttentionPolicy::mask(tq, tk, opts, window);
      return at::Tensor();  // every query sees every key
    }
  };
  r.add(spec_fault("spec-verify-no-causal-mask", "the verify step's queries see the drafts after them (no causal mask where T > 1)",
                   {kSpecGreedy}, [](SpeculativeRules& s) {
                     s.verify_policy = [](const Config&) { return std::make_shared<VerifyWithoutCausalMask>(); };
                   }));

  // The drafts positioned one place late: the block rotated from the first draft's position, not from
  // the last committed id's.
  class VerifyPositionsOffByOne final : public AttentionPolicy {
   public:
    explicit VerifyPositionsOffByOne(int64_t context) : band_(context) {}
    void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start, const Rotary& r) const override {
      AttentionPolicy::position(q, k, v, q.size(2) > 1 ? start + 1 : start, r);
    }
    void position_rows(at::Tensor& q, at::Tensor& k, at::Tensor& v, const at::Tensor& positions, const Rotary& r) const override {
      AttentionPolicy::position_rows(q, k, v, q.size(2) > 1 ? positions + 1 : positions, r);  // a batch's verify step (RowBatch::verify)
    }
    at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const override {
      return band_.mask(tq, tk, opts, window);
    }

   private:
    VerifyPolicy band_;
  };
  r.add(spec_fault("spec-verify-positions-off-by-one", "the verify block rotated from one position late", {kSpecGreedy},
                   [](SpeculativeRules& s) {
                     s.verify_policy = [](const Config& c) { return std::make_shared<VerifyPositionsOffByOne>(c.context); };
                   }));
  r.add(spec_fault("spec-rejected-entries-kept", "a round's rejected drafts left in the target's cache (no rollback; vLLM #9730's family)",
                   {kSpecGreedy, kSpecCache}, [](SpeculativeRules& s) { s.rollback = [](int64_t) { return int64_t{0}; }; }), {"reference:spec-rejected-entries-kept"});
  r.add(spec_fault("spec-accepted-count-off-by-one", "a round keeps one draft more than the rule accepted (the first rejected one too)",
                   {kSpecGreedy}, [](SpeculativeRules& s) {
                     s.kept = [](int64_t accepted, int64_t k) { return accepted < k ? accepted + 1 : accepted; };
                   }));
  r.add(spec_fault("spec-bonus-from-last-draft-position", "the bonus id drawn from the last draft's row of the verify step, not the row after it",
                   {kSpecGreedy}, [](SpeculativeRules& s) { s.bonus_row = [](int64_t k) { return k - 1; }; }), {"reference:spec-bonus-from-last-draft-position"});
  r.add(spec_fault("spec-accept-every-draft", "every draft accepted (a wrong match count: transformers #28508)", {kSpecGreedy, kSpecDistribution},
                   [](SpeculativeRules& s) { s.accept = [](double, double, double) { return true; }; }), {"reference:spec-accept-every-draft"});
  r.add(spec_fault("spec-stop-not-ending", "a stop id accepted inside a block does not end the output (transformers #47912, SGLang #31599)",
                   {kSpecStops}, [](SpeculativeRules& s) {
                     s.keep = [](const std::vector<int64_t>& e, const std::vector<int64_t>&, int64_t left) {
                       return std::min<int64_t>(static_cast<int64_t>(e.size()), left);
                     };
                   }), {"reference:spec-stop-not-ending"});
  r.add(spec_fault("spec-budget-overrun", "a token budget ending inside a block emits the whole block", {kSpecStops},
                   [](SpeculativeRules& s) {
                     const auto keep = s.keep;
                     s.keep = [keep](const std::vector<int64_t>& e, const std::vector<int64_t>& stop, int64_t) {
                       return keep(e, stop, std::numeric_limits<int64_t>::max());
                     };
                   }));
  r.add(spec_fault("spec-penalty-counts-drafts", "the penalty's history holds every drafted id of the round, accepted or not (vLLM #33251's family)",
                   {kSpecStops, kSpecDistribution}, [](SpeculativeRules& s) {
                     s.history = [](const std::vector<int64_t>& seq, const std::vector<int64_t>& drafts, int64_t) {
                       std::vector<int64_t> h = seq;
                       h.insert(h.end(), drafts.begin(), drafts.end());
                       return h;
                     };
                   }));
  // The exact rule's negative controls: greedy decoding hides each of them.
  r.add(spec_fault("spec-acceptance-from-draft-stream", "the acceptance test reuses the uniform the draft was drawn with (vLLM #54282)",
                   {kSpecDistribution}, [](SpeculativeRules& s) {
                     s.acceptance_uniform = [](const Proposal& p, int64_t i, at::Generator& g) {
                       return static_cast<size_t>(i) < p.u.size() ? p.u[static_cast<size_t>(i)] : uniform(g);
                     };
                   }));
  r.add(spec_fault("spec-residual-is-p", "after a rejection the id is drawn from p, not from max(0, p - q)", {kSpecDistribution},
                   [](SpeculativeRules& s) { s.residual = [](const at::Tensor& p, const at::Tensor&) { return p; }; }));
  r.add(spec_fault("spec-residual-unnormalised", "the residual's inverse CDF walked as if max(0, p - q) summed to 1", {kSpecDistribution},
                   [](SpeculativeRules& s) {
                     s.draw_from = [](const at::Tensor& weights, double u) { return inverse_cdf(weights, u); };  // u, not u times the total
                   }));
  r.add(spec_fault("spec-q-from-raw-logits", "the rule divides by the draft's raw softmax while the draft was drawn after top-k/top-p (transformers #47932)",
                   {kSpecDistribution}, [](SpeculativeRules& s) {
                     s.ratio_q = [](const Proposal& p, int64_t i, const SamplingSettings&) {
                       return p.logits.defined() ? raw_softmax(p.logits.select(0, i)) : p.q.select(0, i);
                     };
                   }));
  r.add(spec_fault("spec-p-without-sampler", "the target's probabilities without temperature, top-k and top-p (vLLM #10198)",
                   {kSpecGreedy, kSpecDistribution}, [](SpeculativeRules& s) {
                     s.target_probs = [](const at::Tensor& logits, const at::Tensor&, const SamplingSettings&) { return raw_softmax(logits); };
                   }));

  // A zoo fault among them, where its feature is.
  // A layer's cache rolled back only where its layer is full: each layer a rolling cache of its own, the
  // sliding ones never truncated (transformers #48280's family: a sliding-window cache's rejected
  // entries kept under assisted decoding).
  class RollbackSkipsSlidingLayers final : public KVCache {
   public:
    explicit RollbackSkipsSlidingLayers(const Config& c) {
      for (int64_t l = 0; l < c.n_layers; ++l) {
        layers_.push_back(std::make_unique<RollingKVCache>(std::vector<int64_t>{c.cache_window(l)}));
        sliding_.push_back(c.window(l) > 0);
      }
    }
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
      return layers_.at(static_cast<size_t>(l))->update(0, k, v);
    }
    void reset() override {
      for (auto& c : layers_) c->reset();
    }
    int64_t length() const override { return layers_[0]->length(); }
    int64_t bytes() const override {
      int64_t n = 0;
      for (const auto& c : layers_) n += c->bytes();
      return n;
    }
    std::string row_ops_unsupported() const override { return ""; }
    std::unique_ptr<KVCache> clone() const override {
      auto c = std::unique_ptr<RollbackSkipsSlidingLayers>(new RollbackSkipsSlidingLayers());
      for (const auto& l : layers_) c->layers_.push_back(l->clone());
      c->sliding_ = sliding_;
      return c;
    }
    void truncate(int64_t n) override {
      for (size_t l = 0; l < layers_.size(); ++l)
        if (!sliding_[l]) layers_[l]->truncate(n);
    }
    std::string save_unsupported() const override { return ""; }
    std::pair<at::Tensor, at::Tensor> stored(int64_t l) const override { return layers_.at(static_cast<size_t>(l))->stored(0); }

   private:
    RollbackSkipsSlidingLayers() = default;
    std::vector<std::unique_ptr<KVCache>> layers_;
    std::vector<bool> sliding_;
  };
  {
    CacheVariant v;
    v.name = "spec-rollback-skips-sliding-layers";
    v.description = "a speculative rollback truncates the full layers' caches and not the sliding layers' (transformers #48280's family)";
    v.make_cache = [](const Config& c) { return std::make_unique<RollbackSkipsSlidingLayers>(c); };
    v.is_fault = true;
    v.expected = {check::kSpecGreedy, check::kSpecCache};
    v.checks = {check::kTokens, check::kSpecGreedy, check::kSpecCache};
    v.applies = [](const Config& c) { return c.has_sliding(); };
    v.feature = "a sliding layer";
    r.add(std::move(v));
  }
}

}  // namespace tinygpt::checks::faults
