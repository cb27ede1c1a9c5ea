// The production decode path (kernel_step.h): the reference model's layers with the decode kernels.
#include "tinygpt/kernel_step.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tinygpt/gpt.h"
#include "tinygpt/huge_pages.h"
#include "tinygpt/kv_cache.h"

namespace tinygpt {

namespace {

at::Tensor decode_attend(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask) {
  return attend(q, K, V, mask, Kernels::Decode);  // the kernel for one query and no mask, else the reference
}

// BlockImpl::forward, layer after layer, with the products and norms through `k`; the residual adds,
// the bias and the GELU folded into the products (kernels.h). x (B, T, d) -> (B, T, d).
at::Tensor blocks_with(GPTImpl& model, at::Tensor x, int64_t start, const AttentionPolicy& policy, KVCache* cache,
                       Kernels k, const at::Tensor& positions) {
  auto norm = [&](const Norm& n, const at::Tensor& t) {
    return layer_norm(t, n->weight, n->bias, n->eps(), k);
  };
  int64_t layer = 0;
  for (const auto& m : *model.blocks) {
    auto* b = m->as<BlockImpl>();
    const AttentionImpl& a = *b->attn;
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = a.n_heads(), hd = C / H;
    auto parts = project(norm(b->norm1, x), a.qkv->weight, {}, k).split(C, -1);  // 3 x (B, T, d)
    auto heads = [&](const at::Tensor& t) { return t.view({B, T, H, hd}).transpose(1, 2); };
    const at::Tensor y = a.attend_heads(heads(parts[0]), heads(parts[1]), heads(parts[2]), start, policy, cache, layer++,
                                        positions, k == Kernels::Decode ? &decode_attend : &attention_reference);  // (B, H, T, hd)
    // x + attn(norm1(x)), the add inside the output projection
    const at::Tensor h = project(y.transpose(1, 2).reshape({B, T, C}), a.out->weight, {}, k, /*residual=*/x);  // (B, T, d)
    // h + mlp(norm2(h))
    const at::Tensor u = project(norm(b->norm2, h), b->up->weight, b->up->bias, k, {}, /*gelu=*/true);  // (B, T, 4d)
    x = project(u, b->down->weight, b->down->bias, k, /*residual=*/h);                                  // (B, T, d)
  }
  return x;
}

// GPTImpl::head with `k`: x (..., d) -> (..., V).
at::Tensor head_with(GPTImpl& model, const at::Tensor& x, Kernels k) {
  const at::Tensor n = layer_norm(x, model.norm->weight, model.norm->bias, model.norm->eps(), k);
  return project(n, model.emb->weight, {}, k);
}

}  // namespace

at::Tensor step_with(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy,
                     Kernels kernels) {
  // Our kernels implement the seed's architecture; a zoo member's step is the model's own (SPEC 10).
  if (kernels == Kernels::Library || !model.seed_architecture()) return model.step_unchecked(idx, cache, start, policy);
  if (start < 0) throw std::invalid_argument("step: start position must be >= 0");
  const at::Tensor x = blocks_with(model, model.emb->forward(idx), start, policy, &cache, kernels, {});  // (B, T, d)
  return head_with(model, x.select(1, x.size(1) - 1), kernels);                                         // (B, V)
}

at::Tensor step_every_with(GPTImpl& model, const at::Tensor& idx, KVCache& cache, int64_t start, const AttentionPolicy& policy,
                           Kernels kernels) {
  if (kernels == Kernels::Library || !model.seed_architecture()) return model.step_every(idx, cache, start, policy);
  if (start < 0) throw std::invalid_argument("step: start position must be >= 0");
  check_token_ids(idx, model.config().vocab_size, "step");
  const at::Tensor x = blocks_with(model, model.emb->forward(idx), start, policy, &cache, kernels, {});  // (B, T, d)
  return head_with(model, x, kernels);                                                                  // (B, T, V)
}

namespace {
// The layers at per-row positions with `kernels`: idx (B, T), positions (B, T) -> (B, T, d).
at::Tensor blocks_at(GPTImpl& model, const at::Tensor& idx, KVCache& cache, const at::Tensor& positions,
                     const AttentionPolicy& policy, Kernels kernels) {
  if (positions.dim() != 2 || !positions.sizes().equals(idx.sizes()))
    throw std::invalid_argument("step_at: positions must be (B, T) like idx");
  return blocks_with(model, model.emb->forward(idx), /*start=*/0, policy, &cache, kernels, positions.to(idx.device()));
}
}  // namespace

at::Tensor step_at_with(GPTImpl& model, const at::Tensor& idx, KVCache& cache, const at::Tensor& positions,
                        const AttentionPolicy& policy, Kernels kernels) {
  if (kernels == Kernels::Library || !model.seed_architecture()) return model.step_at(idx, cache, positions, policy);
  const at::Tensor x = blocks_at(model, idx, cache, positions, policy, kernels);  // (B, T, d)
  return head_with(model, x.select(1, x.size(1) - 1), kernels);                 // (B, V)
}

at::Tensor step_at_every_with(GPTImpl& model, const at::Tensor& idx, KVCache& cache, const at::Tensor& positions,
                              const AttentionPolicy& policy, Kernels kernels) {
  if (kernels == Kernels::Library || !model.seed_architecture()) return model.step_at_every(idx, cache, positions, policy);
  return head_with(model, blocks_at(model, idx, cache, positions, policy, kernels), kernels);  // (B, T, V)
}

void pack_parameters(GPTImpl& model) {
  std::vector<at::Tensor> order;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    if (item.value().unsafeGetTensorImpl() != model.emb->weight.unsafeGetTensorImpl()) order.push_back(item.value());
  order.push_back(model.emb->weight);  // the tied head reads it last
  for (const auto& t : order)
    if (!t.device().is_cpu() || t.scalar_type() != at::kFloat) return;
  constexpr int64_t kAlignFloats = 16;  // 64 bytes
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& t : order) {
    offsets.push_back(total);
    total += (t.numel() + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  const at::Tensor block = huge_page_floats(total);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < order.size(); ++i) {
    at::Tensor t = order[i];
    at::Tensor slot = block.narrow(0, offsets[i], t.numel()).view(t.sizes());
    slot.copy_(t);
    t.set_data(slot);
  }
}

}  // namespace tinygpt
