// The zoo's building blocks (SPEC 10) in LibTorch ops, each computed as transformers 5.12 computes it:
// the norms (LayerNorm, RMSNorm, Gemma's (1 + w) RMSNorm), the activations and the gated MLP, the
// soft-cap, and attention with grouped KV heads, a scale of its own and an optional soft-cap. The
// seed's model (gpt.cpp) keeps its own ops so its goldens hold bit for bit; a model with other knobs
// is built from these. tests/zoo/ holds each against transformers' own modules.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "tinygpt/config.h"

namespace tinygpt {

// x (..., d) over its last dim; w (d), b (d) for LayerNorm (undefined: none). Returns x's shape and dtype.
at::Tensor zoo_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, NormKind kind);

at::Tensor activate(const at::Tensor& x, Activation a);

// down(act(gate(x)) * up(x)) with no biases: x (..., d), gate and up (f, d), down (d, f) -> (..., d).
at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down, Activation a);

// c tanh(s / c), c > 0: s of any shape.
at::Tensor softcap(const at::Tensor& s, double c);

// K (B, G, S, hd) -> (B, G x group, S, hd): KV head g serves query heads g x group .. g x group + group - 1.
at::Tensor expand_kv(const at::Tensor& K, int64_t group);

// softmax(cap(q K^T x scale) + mask) V with G <= H KV heads: q (B, H, T, hd), K and V (B, G, S, hd),
// H a multiple of G; mask (T, S) additive, broadcastable, or undefined; cap the soft-cap when given.
// Returns (B, H, T, hd).
at::Tensor zoo_attention(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask, double scale,
                         std::optional<double> cap);

}  // namespace tinygpt
