#include "tinygpt/gpt.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/activation.h>

#include <cmath>
#include <limits>
#include <stdexcept>

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

AttentionImpl::AttentionImpl(const Config& cfg) : n_heads_(cfg.n_heads) {
  qkv = register_module("qkv", Linear(cfg.d_model, 3 * cfg.d_model, /*with_bias=*/false));
  out = register_module("out", Linear(cfg.d_model, cfg.d_model, /*with_bias=*/false));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, int64_t start, const AttentionPolicy& policy,
                                  KVCache* cache, int64_t layer, const at::Tensor& positions) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / n_heads_;
  auto parts = qkv->forward(x).split(C, -1);  // 3 x (B, T, d)
  auto heads = [&](const at::Tensor& t) { return t.view({B, T, n_heads_, hd}).transpose(1, 2); };
  const at::Tensor y = attend_heads(heads(parts[0]), heads(parts[1]), heads(parts[2]), start, policy, cache, layer,
                                    positions);  // (B, H, T, hd)
  return out->forward(y.transpose(1, 2).reshape({B, T, C}));  // (B, T, d)
}

at::Tensor AttentionImpl::attend_heads(at::Tensor q, at::Tensor k, at::Tensor v, int64_t start, const AttentionPolicy& policy,
                                       KVCache* cache, int64_t layer, const at::Tensor& positions, AttendFn attend) const {
  const int64_t B = q.size(0), T = q.size(2);
  if (positions.defined()) policy.position_rows(q, k, v, positions);
  else policy.position(q, k, v, start);
  at::Tensor K = k, V = v;
  if (cache != nullptr) std::tie(K, V) = cache->update(layer, k, v);  // (B, H, S, hd)
  if (!K.defined()) {  // rows of different lengths, each row's keys unpadded: each row attends alone
    const auto rows = cache->rows_seen(layer);                          // B x (1, H, S_r, hd)
    std::vector<at::Tensor> ys;
    for (int64_t b = 0; b < B; ++b) {
      const auto& [Kb, Vb] = rows.at(static_cast<size_t>(b));
      ys.push_back(attend(q.narrow(0, b, 1), Kb, Vb, policy.mask(T, Kb.size(2), q.options())));  // (1, H, T, hd)
    }
    return at::cat(ys, 0);  // (B, H, T, hd)
  }
  at::Tensor mask = policy.mask(T, K.size(2), q.options());  // (T, S) or undefined
  if (cache != nullptr) {
    // Rows of different lengths: each row sees only its own keys, (B, 1, 1, S) added to (T, S).
    const at::Tensor seen = cache->key_mask(layer);  // (B, S) bool or undefined
    if (seen.defined()) {
      at::Tensor hide = at::zeros({B, 1, 1, K.size(2)}, q.options())
                            .masked_fill(seen.logical_not().view({B, 1, 1, K.size(2)}), -std::numeric_limits<double>::infinity());
      mask = mask.defined() ? mask + hide : hide;
    }
  }
  return attend(q, K, V, mask);  // (B, H, T, hd)
}

BlockImpl::BlockImpl(const Config& cfg) {
  const auto ln = nn::LayerNormOptions({cfg.d_model}).eps(1e-5);
  norm1 = register_module("norm1", nn::LayerNorm(ln));
  attn = register_module("attn", Attention(cfg));
  norm2 = register_module("norm2", nn::LayerNorm(ln));
  up = Linear(cfg.d_model, 4 * cfg.d_model);
  down = Linear(4 * cfg.d_model, cfg.d_model);
  mlp = register_module("mlp", nn::Sequential(up, nn::GELU(nn::GELUOptions().approximate("none")), down));  // exact erf GELU
}

at::Tensor BlockImpl::forward(const at::Tensor& x, int64_t start, const AttentionPolicy& policy,
                              KVCache* cache, int64_t layer, const at::Tensor& positions) {
  const at::Tensor h = x + attn->forward(norm1->forward(x), start, policy, cache, layer, positions);  // (B, T, d)
  return h + mlp->forward(norm2->forward(h));                                                          // (B, T, d)
}

void GPTImpl::build() {
  cfg_.validate();
  emb = register_module("emb", nn::Embedding(cfg_.vocab_size, cfg_.d_model));
  blocks = register_module("blocks", nn::ModuleList());
  for (int64_t i = 0; i < cfg_.n_layers; ++i) blocks->push_back(Block(cfg_));
  norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({cfg_.d_model}).eps(1e-5)));
}

GPTImpl::GPTImpl(const Config& cfg, WeightsToFill) : cfg_(cfg) { build(); }

GPTImpl::GPTImpl(const Config& cfg, uint64_t seed) : cfg_(cfg) {
  build();

  // Series initialisation: weights N(0, 0.02), biases 0, LayerNorm (1, 0); then the two
  // projections that write into the residual stream are re-drawn with std 0.02/sqrt(2 L), so
  // the residual's variance does not grow with depth. A private generator makes the weights a
  // function of `seed` alone, whatever the global RNG (which the sampler uses) holds.
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  emb->weight.normal_(0.0, 0.02, gen);
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layers));
  for (const auto& m : *blocks) {
    auto* b = m->as<BlockImpl>();
    b->attn->qkv->weight.normal_(0.0, 0.02, gen);
    b->attn->out->weight.normal_(0.0, 0.02, gen);
    for (auto* lin : {b->up.get(), b->down.get()}) {
      lin->weight.normal_(0.0, 0.02, gen);
      lin->bias.zero_();
    }
  }
  for (const auto& m : *blocks) {
    auto* b = m->as<BlockImpl>();
    b->attn->out->weight.normal_(0.0, resid_std, gen);
    b->down->weight.normal_(0.0, resid_std, gen);
  }
  // LayerNorm defaults are already weight 1, bias 0.
}

at::Tensor GPTImpl::head(const at::Tensor& x) {
  return at::linear(norm->forward(x), emb->weight);  // tied head: (..., d) -> (..., V)
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
  const at::Tensor x = run_blocks(emb->forward(idx), /*start=*/0, production_policy(), nullptr);  // (B, T, d)
  return head(x.narrow(1, T - 1, 1)).select(1, 0);                                            // (B, V)
}

at::Tensor GPTImpl::forward_with(const at::Tensor& idx, const AttentionPolicy& policy) {
  check_token_ids(idx, cfg_.vocab_size, "forward");
  at::Tensor x = emb->forward(idx);                          // (B, T, d)
  return head(run_blocks(x, /*start=*/0, policy, nullptr));  // (B, T, V)
}

at::Tensor GPTImpl::step(const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy) {
  check_token_ids(idx, cfg_.vocab_size, "step");
  return step_unchecked(idx, cache, start, policy);
}

at::Tensor GPTImpl::step_every(const at::Tensor& idx, KVCache& cache, int64_t start) {
  check_token_ids(idx, cfg_.vocab_size, "step");
  if (start < 0) throw std::invalid_argument("step: start position must be >= 0");
  const at::Tensor x = run_blocks(emb->forward(idx), start, production_policy(), &cache);  // (B, T, d)
  return head(x);                                                                       // (B, T, V)
}

at::Tensor GPTImpl::step_unchecked(const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy) {
  if (start < 0) throw std::invalid_argument("step: start position must be >= 0");
  at::Tensor x = emb->forward(idx);             // (B, T, d)
  x = run_blocks(x, start, policy, &cache);     // (B, T, d)
  return head(x.select(1, x.size(1) - 1));      // (B, V)
}

at::Tensor GPTImpl::step_at(const at::Tensor& idx, KVCache& cache, const at::Tensor& positions, const AttentionPolicy& policy) {
  if (positions.dim() != 2 || !positions.sizes().equals(idx.sizes()))
    throw std::invalid_argument("step_at: positions must be (B, T) like idx");
  at::Tensor x = emb->forward(idx);                                          // (B, T, d)
  x = run_blocks(x, /*start=*/0, policy, &cache, positions.to(idx.device()));  // (B, T, d)
  return head(x.select(1, x.size(1) - 1));                                  // (B, V)
}

std::vector<std::pair<std::string, at::Tensor>> GPTImpl::state_dict() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  out.emplace_back("head.weight", emb->weight);
  return out;
}

int64_t GPTImpl::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace tinygpt
