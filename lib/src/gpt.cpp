#include "tinygpt/gpt.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/functional.h>

#include <cmath>
#include <memory>
#include <limits>
#include <stdexcept>

#include "tinygpt/rope_scaling.h"
#include "tinygpt/zoo_ops.h"

namespace tinygpt {

namespace nn = torch::nn;

void check_token_ids(const at::Tensor& idx, int64_t vocab_size, const char* what) {
  const std::string w(what);
  if (!idx.defined() || idx.dim() != 2)
    throw std::invalid_argument(w + ": token ids must be a 2-D (B, T) tensor");
  if (idx.scalar_type() != at::kLong)
    throw std::invalid_argument(w + ": token ids must be int64, got " +
                                std::string(c10::toString(idx.scalar_type())));
  if (idx.size(0) < 1 || idx.size(1) < 1)
    throw std::invalid_argument(w + ": token ids must be non-empty (B >= 1, T >= 1)");
  const int64_t lo = idx.min().item<int64_t>(), hi = idx.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size)
    throw std::invalid_argument(w + ": token id " + std::to_string(lo < 0 ? lo : hi) +
                                " outside [0, " + std::to_string(vocab_size) + ")");
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias)
    : in_(in_features), out_(out_features), with_bias_(with_bias) {
  reset();
}

void LinearImpl::reset() {
  weight = register_parameter("weight", at::empty({out_, in_}));
  if (with_bias_) bias = register_parameter("bias", at::empty({out_}));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) { return at::linear(x, weight, bias); }

NormImpl::NormImpl(int64_t d, NormKind kind, double eps) : d_(d), kind_(kind), eps_(eps) { reset(); }

void NormImpl::reset() {
  // LayerNorm and RMSNorm start at the identity (weight 1); Gemma's stores its weight as an offset
  // from 1, so 0 is its identity.
  weight = register_parameter("weight", kind_ == NormKind::RMSNormPlusOne ? at::zeros({d_}) : at::ones({d_}));
  if (kind_ == NormKind::LayerNorm) bias = register_parameter("bias", at::zeros({d_}));
}

// LayerNorm is at::layer_norm, as torch::nn::LayerNorm computes it: the seed's bits.
at::Tensor NormImpl::forward(const at::Tensor& x) const { return zoo_norm(x, weight, bias, eps_, kind_); }

namespace {
// A zoo member's RoPE (SPEC 10) through rope_scaling.h's Rotation.
class ZooRotary final : public Rotary {
 public:
  explicit ZooRotary(const Config& cfg) : rot_(rope_spec(cfg), cfg.rope_pairing) {}
  void rotate(at::Tensor& q, at::Tensor& k, int64_t start) const override {
    const at::Tensor p = at::arange(start, start + q.size(-2), at::kLong);  // (T)
    q = rot_.apply(q, p);
    k = rot_.apply(k, p);
  }
  void rotate_rows(at::Tensor& q, at::Tensor& k, const at::Tensor& positions) const override {
    q = rot_.apply(q, positions);
    k = rot_.apply(k, positions);
  }
  at::Tensor rotate_one(const at::Tensor& x, int64_t start) const override {
    return rot_.apply(x, at::arange(start, start + x.size(-2), at::kLong));
  }
  const RopeSpec* spec() const override { return &rot_.spec(); }
  RopePairing pairing() const override { return rot_.pairing(); }

 private:
  Rotation rot_;
};
}  // namespace

std::shared_ptr<const Rotary> make_rotary(const Config& cfg) {
  if (is_seed_rope(cfg))
    return std::shared_ptr<const Rotary>(&seed_rotary(), [](const Rotary*) {});  // shared and static
  return std::make_shared<ZooRotary>(cfg);
}

AttentionImpl::AttentionImpl(const Config& cfg, int64_t layer, std::shared_ptr<const Rotary> rotary,
                             const FormulaVariant& formulas)
    : n_heads_(cfg.n_heads), n_kv_(cfg.kv_heads()), hd_(cfg.head_dim()), window_(cfg.window(layer)),
      seed_(cfg.is_seed_architecture()),
      scale_(std::pow(cfg.query_pre_attn_scalar > 0 ? cfg.query_pre_attn_scalar : static_cast<double>(cfg.head_dim()), -0.5)),
      qk_norm_after_rope_(!formulas.qk_norm_before_rope),
      rotary_(rotary ? std::move(rotary) : make_rotary(cfg)) {
  if (cfg.attn_softcap > 0) cap_ = cfg.attn_softcap;
  if (formulas.decode_softcap) decode_cap_ = cap_;
  qkv = register_module("qkv", Linear(cfg.d_model, (n_heads_ + 2 * n_kv_) * hd_, cfg.attn_bias));
  out = register_module("out", Linear(n_heads_ * hd_, cfg.d_model, cfg.attn_bias));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", Norm(hd_, cfg.norm, cfg.norm_eps));
    k_norm = register_module("k_norm", Norm(hd_, cfg.norm, cfg.norm_eps));
  }
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, int64_t start, const AttentionPolicy& policy,
                                  KVCache* cache, int64_t layer, const at::Tensor& positions) {
  const int64_t B = x.size(0), T = x.size(1), Hq = n_heads_ * hd_, Hkv = n_kv_ * hd_;
  auto parts = qkv->forward(x).split_with_sizes({Hq, Hkv, Hkv}, -1);  // (B, T, H hd), 2 x (B, T, G hd)
  auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({B, T, n, hd_}).transpose(1, 2); };
  at::Tensor q = heads(parts[0], n_heads_), k = heads(parts[1], n_kv_);  // (B, H, T, hd), (B, G, T, hd)
  if (q_norm && !qk_norm_after_rope_) q = q_norm->forward(q), k = k_norm->forward(k);  // QK-norm: before RoPE (SPEC 10)
  const at::Tensor y = attend_heads(q, k, heads(parts[2], n_kv_), start, policy, cache, layer, positions);  // (B, H, T, hd)
  return out->forward(y.transpose(1, 2).reshape({B, T, Hq}));                                              // (B, T, d)
}

at::Tensor AttentionImpl::attend_heads(at::Tensor q, at::Tensor k, at::Tensor v, int64_t start, const AttentionPolicy& policy,
                                       KVCache* cache, int64_t layer, const at::Tensor& positions, AttendFn attend) const {
  const int64_t B = q.size(0), T = q.size(2);
  if (positions.defined()) policy.position_rows(q, k, v, positions, *rotary_);
  else policy.position(q, k, v, start, *rotary_);
  if (q_norm && qk_norm_after_rope_) q = q_norm->forward(q), k = k_norm->forward(k);  // a FormulaVariant's order
  // The seed's attention through `attend`; a zoo member's with its KV groups, scale and soft-cap.
  const std::optional<double> cap = T == 1 ? decode_cap_ : cap_;
  auto run = [&](const at::Tensor& qq, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask) {
    return seed_ ? attend(qq, K, V, mask) : zoo_attention(qq, K, V, mask, scale_, cap);
  };
  at::Tensor K = k, V = v;
  if (cache != nullptr) std::tie(K, V) = cache->update(layer, k, v);  // (B, G, S, hd)
  if (!K.defined()) {  // rows of different lengths, each row's keys unpadded: each row attends alone
    const auto rows = cache->rows_seen(layer);                          // B x (1, G, S_r, hd)
    std::vector<at::Tensor> ys;
    for (int64_t b = 0; b < B; ++b) {
      const auto& [Kb, Vb] = rows.at(static_cast<size_t>(b));
      ys.push_back(run(q.narrow(0, b, 1), Kb, Vb, policy.mask(T, Kb.size(2), q.options(), window_)));  // (1, H, T, hd)
    }
    return at::cat(ys, 0);  // (B, H, T, hd)
  }
  at::Tensor mask = policy.mask(T, K.size(2), q.options(), window_);  // (T, S) or undefined
  if (cache != nullptr) {
    // Rows of different lengths: each row sees only its own keys, (B, 1, 1, S) added to (T, S).
    const at::Tensor seen = cache->key_mask(layer);  // (B, S) bool or undefined
    if (seen.defined()) {
      at::Tensor hide = at::zeros({B, 1, 1, K.size(2)}, q.options())
                            .masked_fill(seen.logical_not().view({B, 1, 1, K.size(2)}), -std::numeric_limits<double>::infinity());
      mask = mask.defined() ? mask + hide : hide;
    }
  }
  return run(q, K, V, mask);  // (B, H, T, hd)
}

BlockImpl::BlockImpl(const Config& cfg, int64_t layer, std::shared_ptr<const Rotary> rotary, const FormulaVariant& formulas)
    : gated_(cfg.gated_mlp), sandwich_(cfg.sandwich_norms), parallel_(cfg.parallel_residual), act_(cfg.activation) {
  norm1 = register_module("norm1", Norm(cfg.d_model, cfg.norm, cfg.norm_eps));
  attn = register_module("attn", Attention(cfg, layer, std::move(rotary), formulas));
  if (sandwich_) post_attn_norm = register_module("post_attn_norm", Norm(cfg.d_model, cfg.norm, cfg.norm_eps));
  norm2 = register_module("norm2", Norm(cfg.d_model, cfg.norm, cfg.norm_eps));
  const int64_t f = cfg.ffn_dim();
  up = Linear(cfg.d_model, f, cfg.mlp_bias);
  down = Linear(f, cfg.d_model, cfg.mlp_bias);
  if (gated_) {
    gate = Linear(cfg.d_model, f, /*with_bias=*/false);
    mlp = register_module("mlp", nn::Sequential({{"gate", gate}, {"up", up}, {"down", down}}));  // mlp.gate, mlp.up, mlp.down
  } else if (act_ == Activation::GeluErf) {
    mlp = register_module("mlp", nn::Sequential(up, nn::GELU(nn::GELUOptions().approximate("none")), down));  // exact erf GELU
  } else {
    mlp = register_module("mlp", nn::Sequential(up, nn::Functional([a = act_](const at::Tensor& t) { return activate(t, a); }), down));
  }
  if (sandwich_) post_mlp_norm = register_module("post_mlp_norm", Norm(cfg.d_model, cfg.norm, cfg.norm_eps));
}

at::Tensor BlockImpl::mlp_forward(const at::Tensor& x) {
  return gated_ ? gated_mlp(x, gate->weight, up->weight, down->weight, act_) : mlp->forward(x);  // (B, T, d)
}

at::Tensor BlockImpl::forward(const at::Tensor& x, int64_t start, const AttentionPolicy& policy,
                              KVCache* cache, int64_t layer, const at::Tensor& positions) {
  at::Tensor a = attn->forward(norm1->forward(x), start, policy, cache, layer, positions);  // (B, T, d)
  if (parallel_) return mlp_forward(norm2->forward(x)) + a + x;  // GPT-NeoX's order of the adds
  if (sandwich_) a = post_attn_norm->forward(a);
  const at::Tensor h = x + a;                   // (B, T, d)
  at::Tensor m = mlp_forward(norm2->forward(h));
  if (sandwich_) m = post_mlp_norm->forward(m);
  return h + m;                                 // (B, T, d)
}

void GPTImpl::build(const FormulaVariant& formulas) {
  cfg_.validate();
  seed_architecture_ = cfg_.is_seed_architecture();
  emb = register_module("emb", nn::Embedding(cfg_.vocab_size, cfg_.d_model));
  blocks = register_module("blocks", nn::ModuleList());
  const auto rotary = make_rotary(cfg_);  // one frequency table for every layer
  for (int64_t i = 0; i < cfg_.n_layers; ++i) blocks->push_back(Block(cfg_, i, rotary, formulas));
  norm = register_module("norm", Norm(cfg_.d_model, cfg_.norm, cfg_.norm_eps));
  if (!cfg_.tied_embeddings) lm_head = register_module("head", Linear(cfg_.d_model, cfg_.vocab_size, /*with_bias=*/false));
}

GPTImpl::GPTImpl(const Config& cfg, WeightsToFill, const FormulaVariant& formulas) : cfg_(cfg) { build(formulas); }

GPTImpl::GPTImpl(const Config& cfg, uint64_t seed) : cfg_(cfg) {
  build();

  // Series initialisation: weights N(0, 0.02), biases 0, norms at their identity; then the two
  // projections that write into the residual stream are re-drawn with std 0.02/sqrt(2 L), so the
  // residual's variance does not grow with depth. A private generator makes the weights a function
  // of `seed` alone, whatever the global RNG (which the sampler uses) holds. The seed's architecture
  // draws exactly the series' sequence; a zoo member's extra matrices (the gate, an untied head) come
  // in order after their neighbours.
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  emb->weight.normal_(0.0, 0.02, gen);
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layers));
  for (const auto& m : *blocks) {
    auto* b = m->as<BlockImpl>();
    for (auto* lin : {b->attn->qkv.get(), b->attn->out.get(), b->gate ? b->gate.get() : nullptr, b->up.get(), b->down.get()}) {
      if (lin == nullptr) continue;
      lin->weight.normal_(0.0, 0.02, gen);
      if (lin->bias.defined()) lin->bias.zero_();
    }
  }
  if (lm_head) lm_head->weight.normal_(0.0, 0.02, gen);
  for (const auto& m : *blocks) {
    auto* b = m->as<BlockImpl>();
    b->attn->out->weight.normal_(0.0, resid_std, gen);
    b->down->weight.normal_(0.0, resid_std, gen);
  }
}

at::Tensor GPTImpl::head(const at::Tensor& x) {
  at::Tensor logits = at::linear(norm->forward(x), lm_head ? lm_head->weight : emb->weight);  // (..., d) -> (..., V)
  if (cfg_.final_softcap > 0) logits = softcap(logits, cfg_.final_softcap);
  return logits;
}

at::Tensor GPTImpl::embed(const at::Tensor& idx) {
  const at::Tensor x = emb->forward(idx);  // (B, T, d)
  if (!cfg_.embed_scale) return x;
  // Gemma: times sqrt(d) rounded to the activations' dtype first, as transformers' normalizer is.
  return x * at::scalar_tensor(std::sqrt(static_cast<double>(cfg_.d_model)), x.options());
}

at::Tensor GPTImpl::run_blocks(at::Tensor x, int64_t start, const AttentionPolicy& policy,
                               KVCache* cache, const at::Tensor& positions) {
  int64_t layer = 0;
  for (const auto& m : *blocks) x = m->as<BlockImpl>()->forward(x, start, policy, cache, layer++, positions);
  return x;
}

namespace {
// forward's and forward_last's input: valid ids, at most `context` of them.
void check_window(const at::Tensor& idx, const Config& cfg) {
  check_token_ids(idx, cfg.vocab_size, "forward");
  if (idx.size(1) > cfg.context)
    throw std::invalid_argument("forward: sequence length " + std::to_string(idx.size(1)) + " exceeds context " +
                                std::to_string(cfg.context));
}
}  // namespace

at::Tensor GPTImpl::forward(const at::Tensor& idx) {
  check_window(idx, cfg_);
  return forward_with(idx, production_policy());
}

at::Tensor GPTImpl::forward_last(const at::Tensor& idx) {
  check_window(idx, cfg_);
  const int64_t T = idx.size(1);
  const at::Tensor x = run_blocks(embed(idx), /*start=*/0, production_policy(), nullptr);  // (B, T, d)
  return head(x.narrow(1, T - 1, 1)).select(1, 0);                                            // (B, V)
}

at::Tensor GPTImpl::forward_with(const at::Tensor& idx, const AttentionPolicy& policy) {
  check_token_ids(idx, cfg_.vocab_size, "forward");
  at::Tensor x = embed(idx);                          // (B, T, d)
  return head(run_blocks(x, /*start=*/0, policy, nullptr));  // (B, T, V)
}

at::Tensor GPTImpl::step(const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy) {
  check_token_ids(idx, cfg_.vocab_size, "step");
  return step_unchecked(idx, cache, start, policy);
}

at::Tensor GPTImpl::step_every(const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy) {
  check_token_ids(idx, cfg_.vocab_size, "step");
  if (start < 0) throw std::invalid_argument("step: start position must be >= 0");
  const at::Tensor x = run_blocks(embed(idx), start, policy, &cache);  // (B, T, d)
  return head(x);                                                // (B, T, V)
}

at::Tensor GPTImpl::step_unchecked(const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy) {
  if (start < 0) throw std::invalid_argument("step: start position must be >= 0");
  at::Tensor x = embed(idx);             // (B, T, d)
  x = run_blocks(x, start, policy, &cache);     // (B, T, d)
  return head(x.select(1, x.size(1) - 1));  // (B, V)
}

namespace {
// A ragged step's positions: one per token, (B, T) like idx.
void check_positions(const at::Tensor& idx, const at::Tensor& positions) {
  if (positions.dim() != 2 || !positions.sizes().equals(idx.sizes()))
    throw std::invalid_argument("step_at: positions must be (B, T) like idx");
}
}  // namespace

at::Tensor GPTImpl::step_at(const at::Tensor& idx, KVCache& cache, const at::Tensor& positions, const AttentionPolicy& policy) {
  check_positions(idx, positions);
  at::Tensor x = embed(idx);                                          // (B, T, d)
  x = run_blocks(x, /*start=*/0, policy, &cache, positions.to(idx.device()));  // (B, T, d)
  return head(x.select(1, x.size(1) - 1));  // (B, V)
}

at::Tensor GPTImpl::step_at_every(const at::Tensor& idx, KVCache& cache, const at::Tensor& positions, const AttentionPolicy& policy) {
  check_positions(idx, positions);
  const at::Tensor x = run_blocks(embed(idx), /*start=*/0, policy, &cache, positions.to(idx.device()));  // (B, T, d)
  return head(x);                                                                                 // (B, T, V)
}

std::vector<std::pair<std::string, at::Tensor>> GPTImpl::state_dict() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  if (!lm_head) out.emplace_back("head.weight", emb->weight);
  return out;
}

int64_t GPTImpl::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

GPT model_variant(const GPT& base, const Config& cfg, const FormulaVariant& formulas) {
  GPT v(cfg, WeightsToFill{}, formulas);
  const auto from = base->named_parameters(/*recurse=*/true);
  auto to = v->named_parameters(/*recurse=*/true);
  if (from.size() != to.size())
    throw std::invalid_argument("model_variant: the variant has " + std::to_string(to.size()) + " parameters, its base " +
                                std::to_string(from.size()));
  at::NoGradGuard no_grad;
  for (const auto& item : from) {
    at::Tensor* dst = to.find(item.key());
    if (dst == nullptr || !dst->sizes().equals(item.value().sizes()))
      throw std::invalid_argument("model_variant: parameter " + item.key() + " has another shape in the variant's config");
    dst->set_data(item.value());  // the base's tensor itself: no copy
  }
  v->eval();
  return v;
}

}  // namespace tinygpt
