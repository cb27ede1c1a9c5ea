// The zoo's boundary faults (SPEC 10): each a bug engines shipped in a feature the seed's
// architecture lacks, behind the same seams as the seed's faults (a cache, the attention policy, the
// serving schedule) or, for a bug of the model's arithmetic, a model variant (gpt.h's model_variant:
// the same weights, one formula stated otherwise), on the rolling cache and the model's own step - the
// path every member runs. Each says which members have its feature (CacheVariant::applies); on a member
// without it the fault is the production path and must pass.
#include <ATen/ATen.h>

#include "fault.h"
#include "tinygpt/gpt.h"
#include "tinygpt/kv_cache.h"
#include "tinygpt/rope_scaling.h"
#include "tinygpt/serving.h"

namespace tinygpt::checks::faults {

namespace {

// A zoo fault: the rolling cache and the model's own step (every member runs them), one decision
// changed, on the members `applies` names.
CacheVariant zoo_fault(std::string name, std::string description, std::vector<std::string> expected, std::string feature,
                       std::function<bool(const Config&)> applies) {
  CacheVariant v;
  v.name = std::move(name);
  v.description = std::move(description);
  v.make_cache = [](const Config& c) { return std::make_unique<RollingKVCache>(c); };
  v.is_fault = true;
  v.expected = std::move(expected);
  v.feature = std::move(feature);
  v.applies = std::move(applies);
  return v;
}

// Positions q and k with the member's RoPE with one thing changed, from its spec.
class ChangedRope : public AttentionPolicy {
 public:
  void position(at::Tensor& q, at::Tensor& k, at::Tensor& v, int64_t start, const Rotary& r) const override {
    if (!r.spec()) return AttentionPolicy::position(q, k, v, start, r);
    const Rotation rot(changed(*r.spec()), r.pairing());
    const at::Tensor p = at::arange(start, start + q.size(-2), at::kLong);
    q = rot.apply(q, p), k = rot.apply(k, p);
  }
  void position_rows(at::Tensor& q, at::Tensor& k, at::Tensor& v, const at::Tensor& positions, const Rotary& r) const override {
    if (!r.spec()) return AttentionPolicy::position_rows(q, k, v, positions, r);
    const Rotation rot(changed(*r.spec()), r.pairing());
    q = rot.apply(q, positions), k = rot.apply(k, positions);
  }

 protected:
  virtual RopeSpec changed(RopeSpec s) const = 0;
};

bool yarn_with_a_factor(const Config& c) {
  return c.rope_scaling.kind == RopeScaling::Kind::Yarn && rope_attention_factor(rope_spec(c)) != 1.0;
}

}  // namespace

void register_zoo_faults(FaultFile& r) {
  const std::vector<std::string> logit_rows = {check::kLogits, check::kWindowReference};
  auto sliding = [](const Config& c) { return c.has_sliding(); };

  // A rolling cache whose update gives every query head the KV head h % G instead of h / group (SGLang
  // PR #19086's shape: replicated KV heads written to the wrong offsets): it expands the stored G heads
  // to H by tiling, so the attention reads them one to one. Storage, rollback and saves are the rolling
  // cache's own.
  class InterleavedKvHeads final : public KVCache {
   public:
    InterleavedKvHeads(std::unique_ptr<KVCache> inner, int64_t group) : inner_(std::move(inner)), group_(group) {}
    explicit InterleavedKvHeads(const Config& c)
        : InterleavedKvHeads(std::make_unique<RollingKVCache>(c), c.n_heads / c.kv_heads()) {}
    std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
      auto [K, V] = inner_->update(l, k, v);  // (B, G, S, hd)
      if (!K.defined()) return {K, V};
      return {tile(K), tile(V)};              // (B, H, S, hd): head h reads KV head h % G
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> rows_seen(int64_t l) const override {
      auto rows = inner_->rows_seen(l);
      for (auto& [K, V] : rows) K = tile(K), V = tile(V);
      return rows;
    }
    at::Tensor key_mask(int64_t l) const override { return inner_->key_mask(l); }
    void reset() override { inner_->reset(); }
    int64_t length() const override { return inner_->length(); }
    int64_t bytes() const override { return inner_->bytes(); }
    std::string row_ops_unsupported() const override { return inner_->row_ops_unsupported(); }
    std::unique_ptr<KVCache> clone() const override { return std::make_unique<InterleavedKvHeads>(inner_->clone(), group_); }
    void truncate(int64_t n) override { inner_->truncate(n); }
    std::string save_unsupported() const override { return inner_->save_unsupported(); }
    std::pair<at::Tensor, at::Tensor> stored(int64_t l) const override { return inner_->stored(l); }
    int64_t stored_length(int64_t l) const override { return inner_->stored_length(l); }

   private:
    at::Tensor tile(const at::Tensor& t) const { return t.repeat({1, group_, 1, 1}); }
    std::unique_ptr<KVCache> inner_;
    int64_t group_;
  };
  {
    auto v = zoo_fault("gqa-heads-interleaved", "query head h reads KV head h % G instead of h / (H / G) (SGLang PR #19086)",
                       logit_rows, "grouped KV heads, 1 < G < H (with one KV head every query head reads it either way)",
                       [](const Config& c) { return c.kv_heads() > 1 && c.kv_heads() < c.n_heads; });
    v.make_cache = [](const Config& c) { return std::make_unique<InterleavedKvHeads>(c); };
    r.add(std::move(v), {"llama.cpp:kv-heads-interleaved"});
  }

  // The sliding window one key too wide: each sliding layer's cache keeps w entries and its mask lets a
  // query see w + 1 keys.
  class SlidingWindowOffByOneMask final : public AttentionPolicy {
   public:
    at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const override {
      return AttentionPolicy::mask(tq, tk, opts, window > 0 ? window + 1 : 0);
    }
  };
  {
    auto v = zoo_fault("sliding-window-off-by-one", "a sliding layer's query sees w + 1 keys, its cache keeps w", logit_rows,
                       "a sliding layer", sliding);
    v.policy = std::make_shared<SlidingWindowOffByOneMask>();
    v.make_cache = [](const Config& c) {
      std::vector<int64_t> w;
      for (int64_t l = 0; l < c.n_layers; ++l) w.push_back(c.window(l) > 0 ? c.window(l) : c.context);
      return std::make_unique<RollingKVCache>(w);
    };
    r.add(std::move(v));
  }

  // Every layer's cache trimmed at the sliding window, the full layers' too (the window read from the
  // model's config, not the layer's: TensorRT-LLM PR #12597's family): a full layer's decode query sees
  // w keys, not context + 1.
  {
    auto v = zoo_fault("sliding-window-on-global-layer", "a full layer's cache trimmed at the sliding window: its decode sees w keys",
                       logit_rows, "a sliding layer and a full one", [](const Config& c) {
                         bool full = false;
                         for (int64_t l = 0; l < c.n_layers; ++l) full = full || c.window(l) == 0;
                         return c.has_sliding() && full;
                       });
    v.make_cache = [](const Config& c) -> std::unique_ptr<KVCache> {
      if (!c.has_sliding()) return std::make_unique<RollingKVCache>(c);  // no window to misapply: the production cache
      return std::make_unique<RollingKVCache>(std::vector<int64_t>(static_cast<size_t>(c.n_layers), c.sliding_window - 1));
    };
    r.add(std::move(v));
  }

  // The window applied in the prefill's mask only (SGLang PR #4823's shape: the window never reached
  // the decode kernel), with a cache that keeps the full context on every layer (llama.cpp #14157's
  // caches kept for reuse): a decode query on a sliding layer sees up to context + 1 keys.
  class WindowOnlyInPrefill final : public AttentionPolicy {
   public:
    at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t window) const override {
      return AttentionPolicy::mask(tq, tk, opts, tq == 1 ? 0 : window);
    }
  };
  {
    auto v = zoo_fault("window-only-in-prefill",
                       "the sliding window in the prefill's mask only, the cache keeping the full context: a decode query on a "
                       "sliding layer sees past w (SGLang PR #4823)",
                       logit_rows, "a sliding layer", sliding);
    v.policy = std::make_shared<WindowOnlyInPrefill>();
    v.make_cache = [](const Config& c) { return std::make_unique<RollingKVCache>(c.n_layers, c.context); };
    r.add(std::move(v));
  }

  // A sliding layer's cache sized and trimmed at the context, not at its window, and the attention
  // reading every key the cache holds (the kernel trusting the cache to be the window: TensorRT-LLM PR
  // #12597, Mistral ran full attention; transformers #37574's family): the window never applies, in
  // the prefill or the decode.
  class NoWindowInMask final : public AttentionPolicy {
   public:
    at::Tensor mask(int64_t tq, int64_t tk, const c10::TensorOptions& opts, int64_t) const override {
      return AttentionPolicy::mask(tq, tk, opts, 0);
    }
  };
  {
    auto v = zoo_fault("local-cache-trimmed-at-context",
                       "a sliding layer's cache keeps the global window and attention reads all it holds: the window never "
                       "applies (TensorRT-LLM PR #12597)",
                       logit_rows, "a sliding layer", sliding);
    v.policy = std::make_shared<NoWindowInMask>();
    v.make_cache = [](const Config& c) { return std::make_unique<RollingKVCache>(c.n_layers, c.context); };
    r.add(std::move(v), {"transformers:sliding-cache-at-global-window"});
  }

  // The attention soft-cap applied in the prefill only: a decode step's scores go uncapped (llama.cpp
  // PR #8197's family: Gemma 2's caps missing on a path). A model variant without the one-query cap.
  {
    auto v = zoo_fault("softcap-missing-in-decode", "the attention soft-cap applied in the prefill only (llama.cpp PR #8197's family)",
                       logit_rows, "an attention soft-cap", [](const Config& c) { return c.attn_softcap > 0; });
    v.make_model = [](const GPT& m) {
      FormulaVariant f;
      f.decode_softcap = false;
      return model_variant(m, m->config(), f);
    };
    r.add(std::move(v));
  }

  // The final soft-cap left out of the cached step (llama.cpp PR #8197: Gemma 2's final cap missing):
  // a model variant with no final cap.
  {
    auto v = zoo_fault("final-softcap-missing", "the final logit soft-cap left out of the cached step (llama.cpp PR #8197)", logit_rows,
                       "a final soft-cap", [](const Config& c) { return c.final_softcap > 0; });
    v.make_model = [](const GPT& m) {
      Config c = m->config();
      c.final_softcap = 0;
      return model_variant(m, c);
    };
    r.add(std::move(v), {"llama.cpp:final-softcap-dropped", "onnxruntime:final-softcap-dropped"});
  }

  // QK-norm applied after RoPE instead of before (the norm then sees rotated channels): a model variant
  // with the other order.
  {
    auto v = zoo_fault("qk-norm-after-rope", "QK-norm applied to the rotated q and k instead of before RoPE", logit_rows, "QK-norm",
                       [](const Config& c) { return c.qk_norm; });
    v.make_model = [](const GPT& m) {
      FormulaVariant f;
      f.qk_norm_before_rope = false;
      return model_variant(m, m->config(), f);
    };
    // A rotation keeps a vector's RMS, so the norm's division commutes with it; its weight commutes too
    // where it is equal on each pair of channels RoPE turns together (as initialised: all ones), unless
    // YaRN's attention factor scales the rotated vector (the norm after RoPE would divide it out).
    v.inert_on = [](const GPT& m) -> std::string {
      const Config& c = m->config();
      const RopeSpec spec = rope_spec(c);
      if (!c.qk_norm || rope_attention_factor(spec) != 1.0) return "";
      const int64_t r = spec.rotated();
      const at::Tensor a = c.rope_pairing == RopePairing::Adjacent ? at::arange(0, r, 2, at::kLong) : at::arange(0, r / 2, at::kLong);
      const at::Tensor b = c.rope_pairing == RopePairing::Adjacent ? a + 1 : a + r / 2;
      for (const auto& item : m->blocks->children()) {
        const auto* block = item->as<BlockImpl>();
        for (const Norm& n : {block->attn->q_norm, block->attn->k_norm}) {
          const at::Tensor w = n->weight.to(at::kCPU);  // (hd)
          if (!w.index_select(0, a).equal(w.index_select(0, b))) return "";
        }
      }
      return "its QK-norm weights are equal on each pair of channels RoPE turns together (as initialised), so the norm "
             "commutes with the rotation and its order cannot show";
    };
    r.add(std::move(v));
  }

  // Gemma's (1 + w) applied twice: the loader folded the 1 into the weight and the norm adds it again
  // (vLLM PR #31464), so every norm scales by 2 + w: a model variant whose (1 + w) norms store w + 1.
  {
    auto v = zoo_fault("norm-plus-one-twice", "Gemma's (1 + w) norms add the 1 twice: every norm scales by 2 + w (vLLM PR #31464)",
                       logit_rows, "Gemma's (1 + w) norm", [](const Config& c) { return c.norm == NormKind::RMSNormPlusOne; });
    v.make_model = [](const GPT& m) {
      GPT variant = model_variant(m, m->config());
      at::NoGradGuard no_grad;
      for (auto& item : variant->named_modules())
        if (auto* n = item.value()->as<NormImpl>(); n && n->kind() == NormKind::RMSNormPlusOne) n->weight.set_data(n->weight + 1.0);
      return variant;
    };
    r.add(std::move(v));
  }

  // YaRN's attention factor dropped (vLLM PR #48623, transformers PR #47435: mscale ignored).
  class YarnAttentionFactorMissing final : public ChangedRope {
    RopeSpec changed(RopeSpec s) const override {
      s.scaling.attention_factor = 1.0;
      return s;
    }
  };
  {
    auto v = zoo_fault("yarn-attention-factor-missing", "YaRN's attention factor left out of cos and sin (vLLM PR #48623)", logit_rows,
                       "YaRN scaling with an attention factor other than 1", yarn_with_a_factor);
    v.policy = std::make_shared<YarnAttentionFactorMissing>();
    r.add(std::move(v));
  }

  // Partial rotary ignored: the whole head rotated (a converter that drops rotary_pct).
  class PartialRotaryRotatesAll final : public ChangedRope {
    RopeSpec changed(RopeSpec s) const override {
      s.partial_rotary = 1.0;
      return s;
    }
  };
  {
    auto v = zoo_fault("partial-rotary-rotates-all", "RoPE turns the whole head where the model rotates a fraction of it", logit_rows,
                       "partial rotary", [](const Config& c) { return c.partial_rotary < 1.0; });
    v.policy = std::make_shared<PartialRotaryRotatesAll>();
    r.add(std::move(v));
  }

  // The context shift's K-shift re-rotates kept keys with the unscaled frequencies (llama.cpp PR
  // #17945: build_rope_shift without the scaling the model was built with).
  class ShiftIgnoresRopeScaling final : public ServingSchedule {
   public:
    bool shift_uses_rope_scaling() const override { return false; }
  };
  {
    auto v = zoo_fault("shift-ignores-rope-scaling",
                       "a context shift re-rotates kept keys with the unscaled frequencies (llama.cpp PR #17945)",
                       {check::kContextShift}, "RoPE scaling", [](const Config& c) { return c.rope_scaling.kind != RopeScaling::Kind::None; });
    v.serving = std::make_shared<ShiftIgnoresRopeScaling>();
    v.checks = {check::kContextShift};
    r.add(std::move(v));
  }

  // The context shift's K-shift multiplies every cached key by YaRN's attention factor once more: llama.cpp
  // 0.4 and 0.7 rotate each cell of the cache by its own delta (0 for cells that did not move) through
  // ggml_rope_ext with the forward pass's YaRN arguments, and ggml multiplies cos and sin by
  // 1 + 0.1 ln(factor) (docs/engines.md, "Engines on the zoo": a finding, tests/engines/yarn_shift.py).
  class ShiftReappliesYarnFactor final : public ServingSchedule {
   public:
    double shift_key_gain(const Config& c) const override { return rope_attention_factor(rope_spec(c)); }
  };
  {
    auto v = zoo_fault("shift-reapplies-yarn-factor",
                       "a context shift multiplies every cached key, of every row, by YaRN's attention factor once more "
                       "(llama.cpp 0.4 and 0.7's K-shift: docs/engines.md)",
                       {check::kContextShift}, "YaRN's attention factor", yarn_with_a_factor);
    v.serving = std::make_shared<ShiftReappliesYarnFactor>();
    v.checks = {check::kContextShift};
    r.add(std::move(v));
  }
}

}  // namespace tinygpt::checks::faults
