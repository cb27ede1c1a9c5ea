#include "tinygpt/tools/cross_device.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <sstream>

#include "tinygpt/generate.h"

namespace tinygpt::tools {

using namespace checks;

namespace {

// (L, V) pairs -> per-row NMSE, in double on the CPU.
std::vector<double> nmse(const at::Tensor& ref, const at::Tensor& got) {
  at::Tensor a = ref.to(at::kCPU).to(at::kDouble), b = got.to(at::kCPU).to(at::kDouble);
  at::Tensor e = ((a - b).pow(2).sum(-1) / a.pow(2).sum(-1).clamp_min(1e-30)).contiguous();
  return std::vector<double>(e.data_ptr<double>(), e.data_ptr<double>() + e.numel());
}

struct Run {
  at::Tensor seq, logits;  // (1, T0 + n), (n, V)
};

Run greedy_run(GPT& model, const at::Tensor& prompt, int64_t n, const CacheVariant& v) {
  Recorder keep;
  Decoder d = v.decoder(model->config());
  const c10::Device dev = model->emb->weight.device();
  Run r;
  r.seq = generate_cached(model, prompt.to(dev), n, greedy(), *d.cache, d.path, keep.observer()).to(at::kCPU);
  r.logits = keep.stacked()[0].to(at::kCPU);  // (n, V)
  return r;
}

bool in_top2(const at::Tensor& logits, int64_t id) {
  at::Tensor top = std::get<1>(logits.topk(2));
  return (top == id).any().item<bool>();
}

}  // namespace

bool CrossDeviceResult::passed() const { return worst_forward <= kNmseTolerance && worst_loop <= kNmseTolerance && near_tie; }

CrossDeviceResult cross_device(GPT& cpu, GPT& other, const at::Tensor& prompt, int64_t tokens, const CacheVariant& cpu_cache,
                               const CacheVariant& other_cache) {
  if (tokens < 1) throw std::invalid_argument("cross-device: --tokens must be >= 1");
  at::NoGradGuard no_grad;
  CrossDeviceResult r;
  r.device = other->emb->weight.device().str();
  r.cache = other_cache.name;
  r.prompt_len = prompt.size(1);
  r.tokens = tokens;
  const Run a = greedy_run(cpu, prompt, tokens, cpu_cache), b = greedy_run(other, prompt, tokens, other_cache);
  at::Tensor differ = (a.seq != b.seq).nonzero();
  const int64_t upto = differ.numel() ? differ[0][1].item<int64_t>() - r.prompt_len + 1 : tokens;  // steps to compare
  if (differ.numel()) {
    r.first_difference = differ[0][1].item<int64_t>();
    const int64_t step = *r.first_difference - r.prompt_len;
    const at::Tensor la = a.logits[step], lb = b.logits[step];
    r.near_tie = in_top2(la, b.seq[0][*r.first_difference].item<int64_t>()) && in_top2(lb, a.seq[0][*r.first_difference].item<int64_t>());
    at::Tensor top = std::get<0>(la.topk(2));
    r.margin_at_difference = (top[0] - top[1]).item<double>();
  }
  r.loop_nmse = nmse(a.logits.narrow(0, 0, upto), b.logits.narrow(0, 0, upto));
  // The full forward on both devices over the CPU's sequence (its last `context` tokens).
  const int64_t ctx = cpu->config().context, L = a.seq.size(1) - 1, w = std::min(L, ctx);
  const at::Tensor window = a.seq.narrow(1, L - w, w);
  r.forward_nmse = nmse(cpu->forward(window)[0], other->forward(window.to(other->emb->weight.device()))[0]);
  for (double e : r.forward_nmse) r.worst_forward = std::max(r.worst_forward, e);
  for (double e : r.loop_nmse) r.worst_loop = std::max(r.worst_loop, e);
  return r;
}

std::string format_cross_device(const CrossDeviceResult& r) {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line, "  %s forward: worst NMSE %.2e over %zu positions (tolerance %.0e)\n",
                r.worst_forward <= kNmseTolerance ? "PASS" : "FAIL", r.worst_forward, r.forward_nmse.size(), kNmseTolerance);
  s << "cpu vs " << r.device << " (cache " << r.cache << "), " << r.tokens << " greedy tokens:\n" << line;
  std::snprintf(line, sizeof line, "  %s loop: worst NMSE %.2e over %zu steps\n", r.worst_loop <= kNmseTolerance ? "PASS" : "FAIL",
                r.worst_loop, r.loop_nmse.size());
  s << line;
  if (r.first_difference)
    std::snprintf(line, sizeof line, "  %s tokens: first difference at position %lld, %s (cpu top-2 margin %.2e)\n",
                  r.near_tie ? "PASS" : "FAIL", static_cast<long long>(*r.first_difference),
                  r.near_tie ? "a near-tie (each token in the other's top 2)" : "NOT a near-tie", r.margin_at_difference);
  else
    std::snprintf(line, sizeof line, "  PASS tokens: all %lld positions identical\n", static_cast<long long>(r.prompt_len + r.tokens));
  s << line;
  return s.str();
}

}  // namespace tinygpt::tools
