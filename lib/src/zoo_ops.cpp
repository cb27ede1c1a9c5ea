// The zoo's building blocks (zoo_ops.h, SPEC 10), written with transformers' operations in its order.
#include "tinygpt/zoo_ops.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace tinygpt {

at::Tensor zoo_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, NormKind kind) {
  if (!w.defined() || w.dim() != 1 || w.size(0) != x.size(-1))
    throw std::invalid_argument("norm: weight must be (" + std::to_string(x.size(-1)) + ")");
  switch (kind) {
    case NormKind::LayerNorm: return at::layer_norm(x, {x.size(-1)}, w, b, eps);
    case NormKind::RMSNorm: {  // LlamaRMSNorm: w * (x * rsqrt(mean(x^2) + eps)).to(dtype)
      const at::Tensor xf = x.to(at::kFloat);
      const at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
      return w * (xf * at::rsqrt(var + eps)).to(x.scalar_type());
    }
    case NormKind::RMSNormPlusOne: {  // Gemma2RMSNorm: (x * rsqrt(mean(x^2) + eps)) * (1 + w), then x's dtype
      const at::Tensor xf = x.to(at::kFloat);
      const at::Tensor out = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
      return (out * (w.to(at::kFloat) + 1.0)).to(x.scalar_type());
    }
  }
  throw std::logic_error("norm: unknown kind");
}

at::Tensor activate(const at::Tensor& x, Activation a) {
  switch (a) {
    case Activation::GeluErf: return at::gelu(x);
    case Activation::GeluTanh: return at::gelu(x, "tanh");
    case Activation::Silu: return at::silu(x);
  }
  throw std::logic_error("activate: unknown activation");
}

at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down, Activation a) {
  return at::linear(activate(at::linear(x, gate), a) * at::linear(x, up), down);  // (..., d)
}

at::Tensor softcap(const at::Tensor& s, double c) {
  if (!(c > 0)) throw std::invalid_argument("softcap: the cap must be > 0, got " + std::to_string(c));
  return at::tanh(s / c) * c;
}

at::Tensor expand_kv(const at::Tensor& K, int64_t group) {
  if (K.dim() != 4 || group < 1) throw std::invalid_argument("expand_kv: needs K (B, G, S, hd) and a group >= 1");
  if (group == 1) return K;
  const int64_t B = K.size(0), G = K.size(1), S = K.size(2), hd = K.size(3);
  return K.unsqueeze(2).expand({B, G, group, S, hd}).reshape({B, G * group, S, hd});  // transformers' repeat_kv
}

at::Tensor zoo_attention(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask, double scale,
                         std::optional<double> cap) {
  const int64_t H = q.size(1), G = K.size(1);
  if (G < 1 || H % G != 0)
    throw std::invalid_argument("attention: " + std::to_string(H) + " query heads cannot share " + std::to_string(G) + " KV heads");
  const at::Tensor Ke = expand_kv(K, H / G), Ve = expand_kv(V, H / G);  // (B, H, S, hd)
  at::Tensor att = at::matmul(q, Ke.transpose(2, 3)) * scale;            // (B, H, T, S)
  if (cap) att = softcap(att, *cap);
  if (mask.defined()) att = att + mask;
  return at::matmul(at::softmax(att, -1, at::kFloat).to(q.scalar_type()), Ve);  // (B, H, T, hd)
}

}  // namespace tinygpt
