// The model's hyper-parameters (SPEC 1) and their validation.
// Validation throws std::invalid_argument naming the bad field; it never clamps.
#pragma once

#include <cstdint>
#include <string>

namespace tinygpt {

struct Config {
  int64_t vocab_size = 4096;
  int64_t d_model = 256;
  int64_t n_heads = 4;
  int64_t n_layers = 6;
  int64_t context = 256;
  double dropout = 0.1;  // training only; inference never applies it

  int64_t head_dim() const { return d_model / n_heads; }

  // Throws std::invalid_argument("config: <field> ...") on the first bad field.
  void validate() const;

  bool operator==(const Config& o) const;
  std::string to_string() const;
};

}  // namespace tinygpt
