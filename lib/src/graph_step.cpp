#include "tinygpt/graph_step.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "tinygpt/config.h"
#include "tinygpt/gpt.h"
#include "tinygpt/kernel_step.h"

#ifdef TINYGPT_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace tinygpt {

struct GraphStep::Graph {
#ifdef TINYGPT_WITH_CUDA
  at::cuda::CUDAGraph graph;
#endif
  const GPTImpl* model = nullptr;
  int64_t batch = 0;
  const void* ring = nullptr;                 // the buffers the graph was captured on
  at::Tensor tok, pos, count, freqs, slots;  // static inputs and constants
  at::Tensor out;                             // (B, V), written by every replay
};

GraphStep::GraphStep(RingKVCache& ring) : ring_(ring) {}

GraphStep::~GraphStep() = default;

namespace {

// One decode step over the rings with every input in a device tensor: the function the graph
// captures. The same arithmetic as the model's layers (SPEC 1, 2, 4), written for fixed shapes and
// few kernels (~20 a layer): RoPE on q and k in one pass, the score scale folded into the mask add,
// residual adds folded into the output GEMMs.
at::Tensor graph_step(GPTImpl& m, RingKVCache& ring, const at::Tensor& tok,
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
    at::Tensor& K = ring.ring_k(layer);
    at::Tensor& V = ring.ring_v(layer);
    K.index_copy_(2, slot, k);
    V.index_copy_(2, slot, v);
    at::Tensor att = at::add(mask, at::matmul(q, K.transpose(-2, -1)), scale);  // mask + scale x q.k, (B, H, 1, S)
    at::Tensor y = at::matmul(at::softmax(att, -1), V);                         // (B, H, 1, hd)
    x = at::addmm(x, y.view({B, d}), b->attn->out->weight.t());                        // x + attention out
    const auto& up = b->up;
    const auto& down = b->down;
    at::Tensor u = at::gelu(at::addmm(up->bias, b->norm2->forward(x), up->weight.t()));  // exact erf GELU, (B, 4d)
    x = at::addmm(x + down->bias, u, down->weight.t());                                 // x + MLP out
    ++layer;
  }
  return at::linear(m.norm->forward(x), m.emb->weight);  // (B, V)
}

}  // namespace

void GraphStep::prepare(GPTImpl& model, const at::Tensor& idx, int64_t position) {
  if (idx.dim() != 2 || idx.size(1) != 1) throw std::invalid_argument("GraphStep: a decode step takes idx (B, 1)");
  const at::Tensor& k0 = ring_.ring_k(0);
  if (ring_.fed() == 0 || !k0.defined() || k0.size(0) != idx.size(0) || k0.device() != idx.device())
    throw std::logic_error("GraphStep: a decode step needs a prefill of the same batch on the same device first");
  const int64_t B = idx.size(0), context = ring_.context();
  if (!graph_ || graph_->model != &model || graph_->batch != B || graph_->ring != k0.data_ptr()) {
    graph_ = std::make_unique<Graph>();
    Graph& g = *graph_;
    g.model = &model;
    g.batch = B;
    g.ring = k0.data_ptr();
    const auto dev = idx.device();
    const int64_t hd = model.config().head_dim();
    g.tok = at::zeros({B, 1}, idx.options().dtype(at::kLong));
    g.pos = at::zeros({1}, idx.options().dtype(at::kLong));
    g.count = at::zeros({1}, idx.options().dtype(at::kLong));
    g.freqs = at::pow(10000.0, -at::arange(0, hd, 2, at::TensorOptions().dtype(at::kFloat).device(dev)) / static_cast<double>(hd));
    g.slots = at::arange(context + 1, at::TensorOptions().dtype(at::kLong).device(dev));
  }
  Graph& g = *graph_;
  g.tok.copy_(idx);
  g.pos.fill_(position);
  g.count.fill_(ring_.fed());
}

at::Tensor GraphStep::eager(GPTImpl& model, const at::Tensor& idx, int64_t position) {
  prepare(model, idx, position);
  Graph& g = *graph_;
  at::Tensor out = graph_step(model, ring_, g.tok, g.pos, g.count, g.freqs, g.slots, ring_.context());
  ring_.advance();
  return out;
}

at::Tensor GraphStep::operator()(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, Kernels kernels) {
  if (&cache != &ring_) throw std::logic_error("GraphStep: called with a cache other than the ring it was made for");
  if (idx.size(1) == 1 && idx.is_cuda() && ring_.fed() > 0) return replay(model, idx, start);
  return step_with(model, idx, cache, start, production_policy(), kernels);
}

#ifndef TINYGPT_WITH_CUDA

at::Tensor GraphStep::replay(GPTImpl&, const at::Tensor&, int64_t) {
  throw std::runtime_error("GraphStep: this build has no CUDA");
}

#else

at::Tensor GraphStep::replay(GPTImpl& model, const at::Tensor& idx, int64_t position) {
  const bool fresh = !graph_ || graph_->model != &model || graph_->batch != idx.size(0) || graph_->ring != ring_.ring_k(0).data_ptr();
  prepare(model, idx, position);
  Graph& g = *graph_;
  if (fresh) {
    // Warm up on a side stream (cuBLAS handles, workspaces), then capture there. The warm-up writes
    // the new token's slot with the values the replay writes again.
    torch::cuda::synchronize();
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, idx.device().index());
    {
      c10::cuda::CUDAStreamGuard guard(stream);
      for (int i = 0; i < 2; ++i) graph_step(model, ring_, g.tok, g.pos, g.count, g.freqs, g.slots, ring_.context());
      stream.synchronize();
      g.graph.capture_begin();
      g.out = graph_step(model, ring_, g.tok, g.pos, g.count, g.freqs, g.slots, ring_.context());
      g.graph.capture_end();
    }
    torch::cuda::synchronize();
    ++captures_;
  }
  g.graph.replay();
  ring_.advance();
  return g.out.clone();  // the next replay overwrites g.out
}

#endif

}  // namespace tinygpt
