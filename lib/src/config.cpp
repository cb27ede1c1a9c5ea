#include "tinygpt/config.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace tinygpt {

namespace {
void require(bool ok, const std::string& field, const std::string& why, double got) {
  if (!ok) {
    std::ostringstream s;
    s << "config: " << field << " " << why << " (got " << got << ")";
    throw std::invalid_argument(s.str());
  }
}
}  // namespace

void Config::validate() const {
  require(vocab_size >= 2, "vocab_size", "must be at least 2", double(vocab_size));
  require(d_model >= 2, "d_model", "must be at least 2", double(d_model));
  require(n_heads >= 1, "n_heads", "must be at least 1", double(n_heads));
  require(d_model % n_heads == 0, "d_model", "must be divisible by n_heads=" + std::to_string(n_heads),
          double(d_model));
  require(head_dim() % 2 == 0, "n_heads", "must leave an even head_dim for RoPE (d_model/n_heads)",
          double(n_heads));
  require(n_layers >= 1, "n_layers", "must be at least 1", double(n_layers));
  require(context >= 1, "context", "must be at least 1", double(context));
  require(std::isfinite(dropout) && dropout >= 0.0 && dropout < 1.0, "dropout", "must be in [0, 1)",
          dropout);
}

bool Config::operator==(const Config& o) const {
  return vocab_size == o.vocab_size && d_model == o.d_model && n_heads == o.n_heads &&
         n_layers == o.n_layers && context == o.context && dropout == o.dropout;
}

std::string Config::to_string() const {
  std::ostringstream s;
  s << "vocab_size=" << vocab_size << " d_model=" << d_model << " n_heads=" << n_heads
    << " n_layers=" << n_layers << " context=" << context << " dropout=" << dropout;
  return s.str();
}

}  // namespace tinygpt
