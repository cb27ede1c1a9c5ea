// The reference's own entries for a row that was context-shifted: a shifted row equals no plain
// sequence (its kept entries were computed beside the dropped tokens), so its reference is the
// uncached model's own per-layer keys and values of one forward of the row's tokens, held here
// (plain tensors, appended to and never trimmed: the row stays inside the window), shifted by hand
// in double precision with RoPE's formula (SPEC 2; a zoo member's frequencies, pairing and rotated
// width, SPEC 10) and decoded from by the model's own step. A sliding layer keeps every entry here too:
// the model's mask bands it.
// Private to the harness: context-shift and churn use it; never a cache under test.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "tinygpt/config.h"
#include "tinygpt/kv_cache.h"
#include "tinygpt/rope_scaling.h"

namespace tinygpt::checks {

class ReferenceEntries final : public KVCache {
 public:
  explicit ReferenceEntries(const Config& cfg)
      : k_(static_cast<size_t>(cfg.n_layers)), v_(static_cast<size_t>(cfg.n_layers)), spec_(rope_spec(cfg)),
        pairing_(cfg.rope_pairing), seed_rope_(is_seed_rope(cfg)) {}
  // k, v (1, H, T, hd) appended; returns every entry (1, H, S, hd).
  std::pair<at::Tensor, at::Tensor> update(int64_t l, const at::Tensor& k, const at::Tensor& v) override {
    auto& K = k_.at(static_cast<size_t>(l));
    auto& V = v_.at(static_cast<size_t>(l));
    K = K.defined() ? at::cat({K, k}, 2) : k.clone();
    V = V.defined() ? at::cat({V, v}, 2) : v.clone();
    return {K, V};
  }
  void reset() override {
    for (auto& t : k_) t = at::Tensor();
    for (auto& t : v_) t = at::Tensor();
  }
  int64_t length() const override { return k_[0].defined() ? k_[0].size(2) : 0; }
  int64_t bytes() const override { return 0; }
  // A copy that shares nothing it could change: every update and shift makes new tensors.
  ReferenceEntries copy() const { return *this; }
  // Drops the newest n entries (a rollback).
  void drop_newest(int64_t n) {
    const int64_t keep = length() - n;
    for (size_t l = 0; l < k_.size(); ++l) {
      k_[l] = keep > 0 ? k_[l].narrow(2, 0, keep) : at::Tensor();
      v_[l] = keep > 0 ? v_[l].narrow(2, 0, keep) : at::Tensor();
    }
  }
  // Drops `discard` entries after the first `keep`; the later keys rotated by -discard positions:
  // channel pairs (2j, 2j+1) by the angle -discard * 10000^(-2j/hd), in double precision; a zoo
  // member's pairs (adjacent or halves) of its rotated width by -discard * f_j, f_j its (scaled)
  // frequencies, no attention factor (a rotation composes; the factor was applied once).
  void shift(int64_t keep, int64_t discard) {
    for (size_t l = 0; l < k_.size(); ++l) {
      const at::Tensor K = k_[l], V = v_[l];  // (1, G, S, hd)
      const int64_t S = K.size(2), hd = K.size(3), later = S - keep - discard;
      at::Tensor k2 = K.narrow(2, keep + discard, later).to(at::kDouble);
      const auto f64 = at::TensorOptions().dtype(at::kDouble).device(K.device());
      if (!seed_rope_) {
        k2 = zoo_turn(k2, discard).to(K.scalar_type());
      } else {
        const at::Tensor angle = at::pow(10000.0, -at::arange(0, hd, 2, f64) / static_cast<double>(hd)) * static_cast<double>(-discard);
        const at::Tensor c = angle.cos(), s = angle.sin();                      // (hd/2)
        const at::Tensor a = k2.slice(3, 0, hd, 2), b = k2.slice(3, 1, hd, 2);  // (1, G, later, hd/2)
        k2 = at::stack({a * c - b * s, a * s + b * c}, -1).flatten(-2).to(K.scalar_type());  // (1, G, later, hd)
      }
      k_[l] = at::cat({K.narrow(2, 0, keep), k2}, 2);
      v_[l] = at::cat({V.narrow(2, 0, keep), V.narrow(2, keep + discard, later)}, 2);
    }
  }

 private:
  // x (1, G, n, hd) in double, turned by -discard positions with the member's RoPE.
  at::Tensor zoo_turn(const at::Tensor& x, int64_t discard) const {
    const int64_t hd = x.size(3), r = spec_.rotated();
    const at::Tensor f = rope_inv_frequencies(spec_).to(at::kDouble).to(x.device());  // (r/2)
    const at::Tensor angle = f * static_cast<double>(-discard);
    const at::Tensor c = angle.cos(), s = angle.sin();  // (r/2)
    const at::Tensor rot = x.narrow(3, 0, r);
    at::Tensor out;
    if (pairing_ == RopePairing::Adjacent) {
      const at::Tensor a = rot.slice(3, 0, r, 2), b = rot.slice(3, 1, r, 2);
      out = at::stack({a * c - b * s, a * s + b * c}, -1).flatten(-2);
    } else {  // (j, j + r/2)
      const at::Tensor a = rot.narrow(3, 0, r / 2), b = rot.narrow(3, r / 2, r / 2);
      out = at::cat({a * c - b * s, b * c + a * s}, -1);
    }
    return r < hd ? at::cat({out, x.narrow(3, r, hd - r)}, -1) : out;
  }

  std::vector<at::Tensor> k_, v_;
  RopeSpec spec_;
  RopePairing pairing_;
  bool seed_rope_;
};

}  // namespace tinygpt::checks
