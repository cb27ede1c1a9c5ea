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

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const Config& cfg);

  // x: (B, T, d) for tokens at positions start .. start+T-1, or at `positions` (B, T) when given
  // (rows at positions of their own). cache == nullptr: attend only among these T tokens. Otherwise
  // the cache supplies the keys/values (and which of them each row may see). Returns (B, T, d).
  at::Tensor forward(const at::Tensor& x, int64_t start, const AttentionPolicy& policy,
                     KVCache* cache, int64_t layer, const at::Tensor& positions = {});

  // What forward does between the two projections: q, k, v (B, H, T, hd) as projected, positioned
  // (RoPE at start, or at `positions`), the new keys through the cache, each query against what the
  // policy's mask and the cache let it see, through `attend` (attention_reference here; the
  // production path passes its kernel). Returns (B, H, T, hd).
  using AttendFn = at::Tensor (*)(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask);
  at::Tensor attend_heads(at::Tensor q, at::Tensor k, at::Tensor v, int64_t start, const AttentionPolicy& policy,
                          KVCache* cache, int64_t layer, const at::Tensor& positions,
                          AttendFn attend = &attention_reference) const;
  int64_t n_heads() const { return n_heads_; }

  Linear qkv{nullptr};  // weight (3d, d), no bias
  Linear out{nullptr};  // weight (d, d), no bias

 private:
  int64_t n_heads_;
};
TORCH_MODULE(Attention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const Config& cfg);
  // x: (B, T, d) -> (B, T, d): x + attn(norm1(x)), then h + mlp(norm2(h)); `positions` (B, T) as
  // in AttentionImpl::forward.
  at::Tensor forward(const at::Tensor& x, int64_t start, const AttentionPolicy& policy,
                     KVCache* cache, int64_t layer, const at::Tensor& positions = {});

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  // The state dict names the MLP's layers by position (mlp.0, mlp.2; 1 is the GELU), so they stay
  // in a Sequential; `up` and `down` are the same two modules by name.
  torch::nn::Sequential mlp{nullptr};
  Linear up{nullptr};    // mlp.0: weight (4d, d), bias (4d)
  Linear down{nullptr};  // mlp.2: weight (d, 4d), bias (d)
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  // Weights drawn with the series' initialisation from `seed` (SPEC 1).
  explicit GPTImpl(const Config& cfg, uint64_t seed = 0);
  // Every weight allocated and left for the caller to fill (WeightsToFill).
  GPTImpl(const Config& cfg, WeightsToFill);

  const Config& config() const { return cfg_; }

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
  // logits of each of its positions (a reference that decodes from entries of its own).
  at::Tensor step_every(const at::Tensor& idx, KVCache& cache, int64_t start);
  // step() without validating idx: the caller guarantees ids within [0, V). Checking reads the
  // ids back from the device, and a CUDA decode step must not wait for that; the generation loop
  // validates the prompt once and the chooser's ids on its own.
  at::Tensor step_unchecked(const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy);
  // A cached step of rows at positions of their own: idx (B, T), positions (B, T) int64 (a ragged
  // batch, serving.h). Returns the last column's logits (B, V).
  at::Tensor step_at(const at::Tensor& idx, KVCache& cache, const at::Tensor& positions, const AttentionPolicy& policy);

  // The 64 state-dict entries in the series' order, `head.weight` aliasing `emb.weight`.
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  // Parameters with the tied head counted once.
  int64_t parameter_count() const;

  torch::nn::Embedding emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};

 private:
  // The final norm and the tied head: x (..., d) -> logits (..., V).
  at::Tensor head(const at::Tensor& x);
  at::Tensor run_blocks(at::Tensor x, int64_t start, const AttentionPolicy& policy,
                        KVCache* cache, const at::Tensor& positions = {});
  void build();
  Config cfg_;
};
TORCH_MODULE(GPT);

// Validates idx: 2-D, int64, non-empty, ids within [0, vocab). Throws std::invalid_argument.
void check_token_ids(const at::Tensor& idx, int64_t vocab_size, const char* what);

}  // namespace tinygpt
