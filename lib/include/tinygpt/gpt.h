// The series' Part 3 GPT (SPEC 1): embedding, pre-norm blocks, tied head.
// Parameter names equal the Python state dict, so checkpoints map one to one.
// Leaves out training-time dropout: this library is for inference and verification.
// This is the plain reference (the llm.c way): LibTorch ops one after another, no kernel choice,
// parameters where LibTorch puts them. The production decode path (our kernels, the fused step,
// the parameters packed in one block) lives in kernel_step.h and fused_step.h, computes the same
// function another way, and is tested against this one.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tinygpt/attention_policy.h"
#include "tinygpt/config.h"
#include "tinygpt/kv_cache.h"

namespace tinygpt {

// y = x W^T (+ b), a torch::nn::Linear that draws nothing when built. GPT's constructor draws the
// series' initialisation itself and a checkpoint overwrites every weight, so LibTorch's own draw
// (5.8M numbers from the global generator, about 27 ms of every start here) was thrown away. The
// parameters start uninitialised (at::empty): whoever builds one fills it.
class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = true);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);  // (..., in) -> (..., out)

  at::Tensor weight;  // (out, in)
  at::Tensor bias;    // (out), or undefined without a bias

 private:
  int64_t in_, out_;
  bool with_bias_;
};
TORCH_MODULE(Linear);

// Tag for GPT's constructor: allocate every parameter and draw none of them; the caller fills them
// all (model_from_checkpoint, through load_weights, which refuses a state dict that leaves one out).
struct WeightsToFill {};

// A norm over the last dim of width d (SPEC 1's LayerNorm, or SPEC 10's RMSNorm and Gemma's (1 + w)
// form): weight (d), bias (d) for LayerNorm only. x (..., d) -> (..., d).
class NormImpl : public torch::nn::Cloneable<NormImpl> {
 public:
  NormImpl(int64_t d, NormKind kind, double eps);
  void reset() override;
  at::Tensor forward(const at::Tensor& x) const;
  double eps() const { return eps_; }
  NormKind kind() const { return kind_; }

  at::Tensor weight;  // (d): 1 at construction, 0 for the (1 + w) form
  at::Tensor bias;    // (d) for LayerNorm, else undefined

 private:
  int64_t d_;
  NormKind kind_;
  double eps_;
};
TORCH_MODULE(Norm);

// A model whose arithmetic states one of SPEC 10's formulas otherwise: the one seam through which a
// fault of the model's arithmetic is planted (checks/src/faults/zoo.cpp builds such variants with
// model_variant). Resolved once, when the model is built; a model built from a config alone has the
// defaults, which are SPEC 10.
struct FormulaVariant {
  bool decode_softcap = true;       // false: a one-query step's attention scores go uncapped
  bool qk_norm_before_rope = true;  // false: QK-norm applied to the rotated q and k
};

class AttentionImpl : public torch::nn::Module {
 public:
  // Layer `layer` of a model of `cfg`: its window and the model's rotation (make_rotary(cfg) when
  // `rotary` is null).
  explicit AttentionImpl(const Config& cfg, int64_t layer = 0, std::shared_ptr<const Rotary> rotary = nullptr,
                         const FormulaVariant& formulas = {});

  // x: (B, T, d) for tokens at positions start .. start+T-1, or at `positions` (B, T) when given
  // (rows at positions of their own). cache == nullptr: attend only among these T tokens. Otherwise
  // the cache supplies the keys/values (and which of them each row may see). Returns (B, T, d).
  at::Tensor forward(const at::Tensor& x, int64_t start, const AttentionPolicy& policy,
                     KVCache* cache, int64_t layer, const at::Tensor& positions = {});

  // What forward does between the two projections: q (B, H, T, hd), k and v (B, G, T, hd) as projected
  // (and QK-normed), positioned (RoPE at start, or at `positions`), the new keys through the cache,
  // each query against what the policy's mask, the layer's window and the cache let it see, through
  // `attend` (attention_reference here; the production path passes its kernel) for the seed's
  // architecture, zoo_attention (grouped heads, scale, soft-cap) otherwise. Returns (B, H, T, hd).
  using AttendFn = at::Tensor (*)(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask);
  at::Tensor attend_heads(at::Tensor q, at::Tensor k, at::Tensor v, int64_t start, const AttentionPolicy& policy,
                          KVCache* cache, int64_t layer, const at::Tensor& positions,
                          AttendFn attend = &attention_reference) const;
  int64_t n_heads() const { return n_heads_; }
  int64_t n_kv_heads() const { return n_kv_; }
  int64_t window() const { return window_; }

  Linear qkv{nullptr};  // weight ((H + 2G) hd, d): q rows, then k, then v, head-major; bias with attn_bias
  Linear out{nullptr};  // weight (d, H hd); bias with attn_bias
  Norm q_norm{nullptr}, k_norm{nullptr};  // (hd) each, QK-norm models only

 private:
  int64_t n_heads_, n_kv_, hd_;
  int64_t window_;          // the layer's sliding window, 0 for a full layer
  bool seed_;               // the seed's architecture: attention_reference through `attend`
  double scale_;            // zoo: the score scale
  std::optional<double> cap_;  // zoo: the attention soft-cap
  std::optional<double> decode_cap_;  // the soft-cap of a one-query step (cap_ unless a variant drops it)
  bool qk_norm_after_rope_;
  std::shared_ptr<const Rotary> rotary_;
};
TORCH_MODULE(Attention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const Config& cfg, int64_t layer = 0, std::shared_ptr<const Rotary> rotary = nullptr,
                     const FormulaVariant& formulas = {});
  // x: (B, T, d) -> (B, T, d): x + attn(norm1(x)), then h + mlp(norm2(h)) (SPEC 1), with SPEC 10's
  // sandwich norms or parallel residual when the config asks; `positions` (B, T) as in
  // AttentionImpl::forward.
  at::Tensor forward(const at::Tensor& x, int64_t start, const AttentionPolicy& policy,
                     KVCache* cache, int64_t layer, const at::Tensor& positions = {});
  // The MLP alone: x (B, T, d) -> (B, T, d).
  at::Tensor mlp_forward(const at::Tensor& x);

  Norm norm1{nullptr}, norm2{nullptr};
  Norm post_attn_norm{nullptr}, post_mlp_norm{nullptr};  // sandwich norms only
  Attention attn{nullptr};
  // The state dict names the seed's MLP layers by position (mlp.0, mlp.2; 1 is the GELU), so they stay
  // in a Sequential; `up` and `down` are the same two modules by name. A gated MLP's three are
  // mlp.gate, mlp.up and mlp.down.
  torch::nn::Sequential mlp{nullptr};
  Linear gate{nullptr};  // gated MLPs: weight (f, d)
  Linear up{nullptr};    // weight (f, d), bias (f) with mlp_bias
  Linear down{nullptr};  // weight (d, f), bias (d) with mlp_bias

 private:
  bool gated_, sandwich_, parallel_;
  Activation act_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  // Weights drawn with the series' initialisation from `seed` (SPEC 1).
  explicit GPTImpl(const Config& cfg, uint64_t seed = 0);
  // Every weight allocated and left for the caller to fill (WeightsToFill), computing with `formulas`.
  GPTImpl(const Config& cfg, WeightsToFill, const FormulaVariant& formulas = {});

  const Config& config() const { return cfg_; }
  // config().is_seed_architecture(), computed once: the decode paths ask at every step.
  bool seed_architecture() const { return seed_architecture_; }

  // The uncached reference: idx (B, T) int64 with T <= context, positions 0..T-1, causal.
  // Returns logits (B, T, V).
  at::Tensor forward(const at::Tensor& idx);
  // forward(idx)'s last position only, (B, V): the blocks run over all T tokens as before, the final
  // norm and the tied head over the last row alone (the head was 17% of a 256-token forward's FLOPs,
  // all but one row of it thrown away by the uncached loop). Row-wise ops: the logits equal
  // forward's last row to within BLAS's rounding (Model.ForwardLastIsForwardsLastRow).
  at::Tensor forward_last(const at::Tensor& idx);

  // Full forward with a caller-chosen mask policy and no length limit; positions 0..T-1.
  // idx (B, T) -> logits (B, T, V). With BandedPolicy(context + 1) this is the rolling cache's
  // semantics computed without a cache.
  at::Tensor forward_with(const at::Tensor& idx, const AttentionPolicy& policy);

  // Cached step: feeds idx (B, T) at positions start .. start+T-1 through the cache and returns the
  // last position's logits (B, V): the reference step (decode_step.h for other implementations).
  at::Tensor step(const at::Tensor& idx, KVCache& cache, int64_t start,
                  const AttentionPolicy& policy = production_policy());
  // step() with every fed position's logits, (B, T, V): a chunk fed through the cache at once, the
  // logits of each of its positions (a reference that decodes from entries of its own; speculative.h's
  // verify step, whose policy gives each position a one-token step's window).
  at::Tensor step_every(const at::Tensor& idx, KVCache& cache, int64_t start,
                        const AttentionPolicy& policy = production_policy());
  // step() without validating idx: the caller guarantees ids within [0, V). Checking reads the
  // ids back from the device, and a CUDA decode step must not wait for that; the generation loop
  // validates the prompt once and the chooser's ids on its own.
  at::Tensor step_unchecked(const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy);
  // A cached step of rows at positions of their own: idx (B, T), positions (B, T) int64 (a ragged
  // batch, serving.h). Returns the last column's logits (B, V).
  at::Tensor step_at(const at::Tensor& idx, KVCache& cache, const at::Tensor& positions, const AttentionPolicy& policy);
  // step_at() with every column's logits, (B, T, V): several tokens for each row of a ragged batch at
  // once (a batched speculative verify step, serving.h's RowBatch::verify).
  at::Tensor step_at_every(const at::Tensor& idx, KVCache& cache, const at::Tensor& positions, const AttentionPolicy& policy);

  // The state-dict entries in the series' order (64 for the seed's), `head.weight` aliasing
  // `emb.weight` when the embeddings are tied.
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  // Parameters with the tied head counted once.
  int64_t parameter_count() const;

  torch::nn::Embedding emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  Norm norm{nullptr};
  Linear lm_head{nullptr};  // untied models only: weight (V, d), state-dict name head.weight

 private:
  // The final norm, the head and the final soft-cap: x (..., d) -> logits (..., V).
  at::Tensor head(const at::Tensor& x);
  // The embedding (scaled by sqrt(d) where the config says): idx (B, T) -> (B, T, d).
  at::Tensor embed(const at::Tensor& idx);
  at::Tensor run_blocks(at::Tensor x, int64_t start, const AttentionPolicy& policy,
                        KVCache* cache, const at::Tensor& positions = {});
  void build(const FormulaVariant& formulas = {});
  Config cfg_;
  bool seed_architecture_ = true;
};
TORCH_MODULE(GPT);

// The rotation a model of `cfg` positions q and k with: the seed's RoPE (SPEC 2) when every RoPE knob
// is at its default, else SPEC 10's (rope_scaling.h's Rotation).
std::shared_ptr<const Rotary> make_rotary(const Config& cfg);

// A model of `cfg` computing with `formulas`, on `base`'s parameters (the same tensors, not copies):
// `cfg` must give every parameter base's shape (a soft-cap or another scalar may differ). A variant
// changes a parameter by replacing its tensor (set_data), never in place, so `base` is untouched.
// Throws std::invalid_argument when a shape differs.
GPT model_variant(const GPT& base, const Config& cfg, const FormulaVariant& formulas = {});

// Validates idx: 2-D, int64, non-empty, ids within [0, vocab). Throws std::invalid_argument.
void check_token_ids(const at::Tensor& idx, int64_t vocab_size, const char* what);

}  // namespace tinygpt
