#include "tinygpt/checks/sample_grid.h"

#include <ATen/ATen.h>

#include "tinygpt/generate.h"

namespace tinygpt::checks {

const std::vector<GridSetting>& grid_settings() {
  static const std::vector<GridSetting> g = {
      {"greedy", {0.0, 0, 1.0, 1.0}},
      {"temperature 0.5", {0.5, 0, 1.0, 1.0}},
      {"temperature 1.0", {1.0, 0, 1.0, 1.0}},
      {"temperature 1.5", {1.5, 0, 1.0, 1.0}},
      {"top-k 40", {1.0, 40, 1.0, 1.0}},
      {"top-p 0.9", {1.0, 0, 0.9, 1.0}},
      {"greedy + penalty 1.3", {0.0, 0, 1.0, 1.3}},
      {"top-p 0.9, temp 0.8, penalty 1.3", {0.8, 0, 0.9, 1.3}},
      // Every stage at once, which the seed's grid never does (top-k and top-p together).
      {"temperature 0.8, top-k 40, top-p 0.9, penalty 1.3", SamplingSettings::every_stage()},
  };
  return g;
}

std::vector<GridRow> sample_grid(GPT& model, const Tokenizer& tok, const std::vector<int64_t>& prompt_ids,
                                 uint64_t seed, int64_t tokens, bool keep_logits, const CacheVariant* variant) {
  const c10::Device dev = model->emb->weight.device();
  at::Tensor prompt = at::tensor(prompt_ids, at::kLong).unsqueeze(0).to(dev);  // (1, T0)
  if (!variant) variant = &cache_registry().get(kSeriesCache);
  Decoder d = variant->decoder(model->config());
  std::vector<GridRow> rows;
  for (const auto& g : grid_settings()) {
    GridRow r{g.name, g.settings, {}, "", {}, ""};
    // Re-seeded before each row, as the seed's script does: a generator of the row's own, whose
    // draws equal the default generator's after manual_seed(seed).
    at::Generator gen = make_generator(dev, seed);
    Recorder keep;
    try {
      at::Tensor out = generate_cached(model, prompt, tokens, sampler(g.settings, gen), *d.cache, d.path,
                                       keep_logits ? keep.observer() : StepObserver())[0].to(at::kCPU);
      r.ids.assign(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel());
    } catch (const std::exception& e) {
      std::string msg = e.what();
      if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
      r.error = "sampler failed after " + std::to_string(keep.steps().size()) + " steps: " + msg;
      r.ids = prompt_ids;
    }
    for (const auto& l : keep.steps()) r.logits.push_back(l[0].to(at::kCPU));
    r.text = tok.decode(r.ids);
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace tinygpt::checks
