// An outside project using the installed library: greedy-decode 8 tokens on untrained weights.
#include <ATen/ATen.h>
#include <iostream>
#include <tinygpt/generate.h>

int main() {
  tinygpt::Config cfg;
  tinygpt::GPT model(cfg, /*seed=*/0);
  tinygpt::RollingKVCache cache(cfg);
  at::Tensor prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);  // (1, 3)
  at::Tensor out = tinygpt::generate_cached(model, prompt, 8, tinygpt::greedy(), cache);  // (1, 11)
  std::cout << "consumer ok: " << out.size(1) << " ids, params " << model->parameter_count() << "\n";
  return out.size(1) == 11 ? 0 : 1;
}
