#include "tinygpt/graph_kv_cache.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "tinygpt/config.h"
#include "tinygpt/gpt.h"
#include "tinygpt/rope.h"

#ifdef TINYGPT_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace tinygpt {

struct GraphKVCache::Graph {
#ifdef TINYGPT_WITH_CUDA
  at::cuda::CUDAGraph graph;
#endif
  const GPTImpl* model = nullptr;
  int64_t batch = 0;
  const void* ring = nullptr;                 // the buffers the graph was captured on
  at::Tensor tok, pos, count, freqs, slots;  // static inputs and constants
  at::Tensor out;                             // (B, V), written by every replay
};

GraphKVCache::GraphKVCache(const Config& cfg)
    : n_layers_(cfg.n_layers), context_(cfg.context), k_(cfg.n_layers), v_(cfg.n_layers), fed_(cfg.n_layers, 0) {}

GraphKVCache::~GraphKVCache() = default;

std::pair<at::Tensor, at::Tensor> GraphKVCache::update(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (layer < 0 || layer >= n_layers_) throw std::out_of_range("GraphKVCache: layer " + std::to_string(layer) + " out of range");
  if (k.dim() != 4 || !k.sizes().equals(v.sizes())) throw std::invalid_argument("GraphKVCache: k and v must both be (B, H, T, hd)");
  const int64_t T = k.size(2), slots = context_ + 1;
  at::Tensor& K = k_[layer];
  at::Tensor& V = v_[layer];
  int64_t& fed = fed_[layer];
  if (fed == 0) {  // a prefill: slots 0 .. T-1, in order
    if (T > context_) throw std::invalid_argument("GraphKVCache: a prefill of " + std::to_string(T) + " tokens exceeds the context");
    const bool fits = K.defined() && K.size(0) == k.size(0) && K.size(1) == k.size(1) && K.size(3) == k.size(3) &&
                      K.scalar_type() == k.scalar_type() && K.device() == k.device();
    if (!fits) {
      K = at::zeros({k.size(0), k.size(1), slots, k.size(3)}, k.options());  // (B, H, context + 1, hd)
      V = at::zeros_like(K);
    }
    K.narrow(2, 0, T).copy_(k);
    V.narrow(2, 0, T).copy_(v);
    fed = T;
    return {K.narrow(2, 0, T), V.narrow(2, 0, T)};
  }
  if (T != 1) throw std::invalid_argument("GraphKVCache: after the prefill, one token at a time");
  const int64_t slot = fed % slots;
  K.narrow(2, slot, 1).copy_(k);
  V.narrow(2, slot, 1).copy_(v);
  ++fed;
  // Before the ring wraps its filled slots are 0 .. fed-1; after, all context + 1 (the rolling
  // cache's context stored plus the new one).
  const int64_t filled = std::min(fed, slots);
  return {K.narrow(2, 0, filled), V.narrow(2, 0, filled)};
}

void GraphKVCache::reset() {
  for (auto& f : fed_) f = 0;  // the rings and the graph stay for the next sequence
}

int64_t GraphKVCache::length() const { return std::min(fed_[0], context_); }

int64_t GraphKVCache::bytes() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers_; ++l)
    if (k_[l].defined()) n += 2 * std::min(fed_[l], context_) * (k_[l].numel() / k_[l].size(2)) * k_[l].element_size();
  return n;
}

int64_t GraphKVCache::capacity_bytes() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers_; ++l)
    if (k_[l].defined()) n += (k_[l].numel() + v_[l].numel()) * k_[l].element_size();
  return n;
}

namespace {

// One decode step over the rings with every input in a device tensor: the function the graph
// captures. The same arithmetic as the model's layers (SPEC 1, 2, 4), written for fixed shapes and
// few kernels (~20 a layer): RoPE on q and k in one pass, the score scale folded into the mask add,
// residual adds folded into the output GEMMs.
at::Tensor graph_step(GPTImpl& m, std::vector<at::Tensor>& K, std::vector<at::Tensor>& V, const at::Tensor& tok,
                      const at::Tensor& pos, const at::Tensor& count, const at::Tensor& freqs, const at::Tensor& slots,
                      int64_t context) {
  const Config& cfg = m.config();
  const int64_t B = tok.size(0), H = cfg.n_heads, hd = cfg.head_dim(), d = cfg.d_model;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor ang = pos.to(at::kFloat).unsqueeze(1) * freqs;  // (1, hd/2): position x freq_j in float32
  at::Tensor cos = ang.cos(), sin = ang.sin();
  at::Tensor slot = count.remainder(context + 1);  // (1): where the new token goes
  // Filled slots: 0 .. count before the ring wraps, all once count >= context.
  at::Tensor filled = slots.le(count).logical_or(count.ge(context));  // (context + 1)
  at::Tensor mask = at::zeros({context + 1}, freqs.options()).masked_fill(filled.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor x = m.emb->forward(tok).view({B, d});  // (B, d)
  int64_t layer = 0;
  for (const auto& mod : *m.blocks) {
    auto* b = mod->as<BlockImpl>();
    at::Tensor qkv = at::linear(b->norm1->forward(x), b->attn->qkv->weight);  // (B, 3d): q | k | v, head-major
    // q and k are the first 2d columns: rotate their channel pairs (2j, 2j+1) together.
    at::Tensor pairs = qkv.narrow(1, 0, 2 * d).view({B, 2 * H, hd / 2, 2});
    at::Tensor a = pairs.select(-1, 0), c = pairs.select(-1, 1);  // (B, 2H, hd/2)
    at::Tensor rot = at::stack({at::addcmul(a * cos, c, sin, -1), at::addcmul(a * sin, c, cos)}, -1).view({B, 2 * H, hd});
    at::Tensor q = rot.narrow(1, 0, H).unsqueeze(2), k = rot.narrow(1, H, H).unsqueeze(2);  // (B, H, 1, hd)
    at::Tensor v = qkv.narrow(1, 2 * d, d).view({B, H, 1, hd});
    K[layer].index_copy_(2, slot, k);
    V[layer].index_copy_(2, slot, v);
    at::Tensor att = at::add(mask, at::matmul(q, K[layer].transpose(-2, -1)), scale);  // mask + scale x q.k, (B, H, 1, S)
    at::Tensor y = at::matmul(at::softmax(att, -1), V[layer]);                       // (B, H, 1, hd)
    x = at::addmm(x, y.view({B, d}), b->attn->out->weight.t());                        // x + attention out
    auto* up = b->mlp[0]->as<torch::nn::LinearImpl>();
    auto* down = b->mlp[2]->as<torch::nn::LinearImpl>();
    at::Tensor u = at::gelu(at::addmm(up->bias, b->norm2->forward(x), up->weight.t()));  // exact erf GELU, (B, 4d)
    x = at::addmm(x + down->bias, u, down->weight.t());                                 // x + MLP out
    ++layer;
  }
  return at::linear(m.norm->forward(x), m.emb->weight);  // (B, V)
}

}  // namespace

void GraphKVCache::prepare(GPTImpl& model, const at::Tensor& idx, int64_t position) {
  if (idx.dim() != 2 || idx.size(1) != 1) throw std::invalid_argument("GraphKVCache: a decode step takes idx (B, 1)");
  for (int64_t l = 0; l < n_layers_; ++l)
    if (fed_[l] == 0 || fed_[l] != fed_[0] || !k_[l].defined() || k_[l].size(0) != idx.size(0) || k_[l].device() != idx.device())
      throw std::logic_error("GraphKVCache: a decode step needs a prefill of the same batch on the same device first");
  const int64_t B = idx.size(0);
  if (!graph_ || graph_->model != &model || graph_->batch != B || graph_->ring != k_[0].data_ptr()) {
    graph_ = std::make_unique<Graph>();
    Graph& g = *graph_;
    g.model = &model;
    g.batch = B;
    g.ring = k_[0].data_ptr();
    const auto dev = idx.device();
    const int64_t hd = model.config().head_dim();
    g.tok = at::zeros({B, 1}, idx.options().dtype(at::kLong));
    g.pos = at::zeros({1}, idx.options().dtype(at::kLong));
    g.count = at::zeros({1}, idx.options().dtype(at::kLong));
    g.freqs = at::pow(10000.0, -at::arange(0, hd, 2, at::TensorOptions().dtype(at::kFloat).device(dev)) / static_cast<double>(hd));
    g.slots = at::arange(context_ + 1, at::TensorOptions().dtype(at::kLong).device(dev));
  }
  Graph& g = *graph_;
  g.tok.copy_(idx);
  g.pos.fill_(position);
  g.count.fill_(fed_[0]);
}

at::Tensor GraphKVCache::decode_eager(GPTImpl& model, const at::Tensor& idx, int64_t position) {
  prepare(model, idx, position);
  Graph& g = *graph_;
  at::Tensor out = graph_step(model, k_, v_, g.tok, g.pos, g.count, g.freqs, g.slots, context_);
  for (auto& f : fed_) ++f;
  return out;
}

#ifndef TINYGPT_WITH_CUDA

at::Tensor GraphKVCache::decode(GPTImpl&, const at::Tensor&, int64_t) {
  throw std::runtime_error("GraphKVCache::decode: this build has no CUDA");
}

#else


at::Tensor GraphKVCache::decode(GPTImpl& model, const at::Tensor& idx, int64_t position) {
  if (!idx.is_cuda()) throw std::invalid_argument("GraphKVCache::decode: idx must be on CUDA");
  const bool fresh = !graph_ || graph_->model != &model || graph_->batch != idx.size(0) || graph_->ring != k_[0].data_ptr();
  prepare(model, idx, position);
  Graph& g = *graph_;
  if (fresh) {
    // Warm up on a side stream (cuBLAS handles, workspaces), then capture there. The warm-up writes
    // the new token's slot with the values the replay writes again.
    torch::cuda::synchronize();
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, idx.device().index());
    {
      c10::cuda::CUDAStreamGuard guard(stream);
      for (int i = 0; i < 2; ++i) graph_step(model, k_, v_, g.tok, g.pos, g.count, g.freqs, g.slots, context_);
      stream.synchronize();
      g.graph.capture_begin();
      g.out = graph_step(model, k_, v_, g.tok, g.pos, g.count, g.freqs, g.slots, context_);
      g.graph.capture_end();
    }
    torch::cuda::synchronize();
    ++captures_;
  }
  g.graph.replay();
  for (auto& f : fed_) ++f;
  return g.out.clone();  // the next replay overwrites g.out
}

#endif

}  // namespace tinygpt
