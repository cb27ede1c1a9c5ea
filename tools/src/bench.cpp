#include "tinygpt/tools/bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/conform.h"
#include "tinygpt/blas.h"
#include "tinygpt/device.h"
#include "tinygpt/fused_step.h"
#include "tinygpt/generate.h"
#include "tinygpt/huge_pages.h"
#include "tinygpt/kernels.h"
#include "tinygpt/rope.h"
#include "tinygpt/tools/read_pass.h"

namespace tinygpt::tools {

using namespace checks;

namespace {


// The BLAS library this process actually mapped (Debian switches libblas.so.3 by alternatives).
std::string loaded_blas() {
  std::ifstream in("/proc/self/maps");
  for (std::string line; std::getline(in, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    for (const char* name : {"libopenblas", "libblis", "libmkl", "libblas.so", "libflexiblas", "libatlas"})
      if (path.find(name) != std::string::npos) return path;
  }
  return "none mapped";
}

void sync(c10::Device d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index() < 0 ? -1 : d.index());
}

template <typename F>
double seconds(c10::Device d, F f) {
  sync(d);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  sync(d);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string human_bytes(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return s;
}

}  // namespace

std::vector<StepCost> run_step_costs(const Config& cfg, int64_t batch, int64_t prompt_len, int64_t tokens) {
  if (batch < 1 || prompt_len < 1 || tokens < 1) throw std::invalid_argument("run_step_costs: batch, prompt and tokens must be >= 1");
  const double d = static_cast<double>(cfg.d_model), L = static_cast<double>(cfg.n_layers), B = static_cast<double>(batch);
  const double block_weights = L * 12.0 * d * d;            // qkv 3d^2, out d^2, MLP 2 x 4d^2 per layer
  const double head_weights = static_cast<double>(cfg.vocab_size) * d;  // tied head
  std::vector<StepCost> steps;
  // Step 0 is the prefill: the last min(prompt, context) prompt tokens, one query each, keys 1..T.
  const int64_t prefill = std::min(prompt_len, cfg.context);
  int64_t cached = 0;  // entries in the cache before the step
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t T = i == 0 ? prefill : 1;
    const double S = static_cast<double>(std::min(cached, cfg.context) + T);  // keys the last query sees
    const double keys_read = i == 0 ? 0.0 : S;                                // the prefill attends to its own k, v
    StepCost c;
    c.bytes = 4.0 * (block_weights + head_weights) + 2.0 * L * B * keys_read * d * 4.0;
    // Each query row meets every block weight once; attention q.k and p.v: 2 x 2 x d per key, all
    // keys for a decode query, on average (T + 1) / 2 of them per prefill query (causal).
    const double att_keys = i == 0 ? static_cast<double>(T) * (T + 1) / 2.0 : S;
    c.flops = B * (2.0 * static_cast<double>(T) * block_weights + 2.0 * head_weights + 4.0 * L * d * att_keys);
    steps.push_back(c);
    cached = std::min(cached, cfg.context) + T;
  }
  return steps;
}

double run_bound_seconds(const std::vector<StepCost>& steps, double read_bytes_s, double flops_s) {
  if (!(read_bytes_s > 0) || !(flops_s > 0)) throw std::invalid_argument("run_bound_seconds: rates must be > 0");
  double t = 0;
  for (const auto& c : steps) t += std::max(c.bytes / read_bytes_s, c.flops / flops_s);
  return t;
}

double measure_read_rate(c10::Device device, int64_t bytes) {
  const int64_t n = std::max<int64_t>(1 << 14, bytes / 4);
  at::NoGradGuard no_grad;
  // On the CPU in huge pages, where the model keeps its weights and the static cache its keys.
  const at::Tensor buf = device.is_cpu() ? huge_page_floats(n).fill_(1.0f) : at::ones({n}, at::TensorOptions().dtype(at::kFloat).device(device));
  float total = 0;
  auto pass = [&] { total = device.is_cuda() ? buf.sum().item<float>() : read_pass(buf); };
  double best = 0;
  for (int rep = 0; rep < 8; ++rep) {
    const double t = seconds(device, pass);
    if (rep > 0 && t > 0) best = std::max(best, static_cast<double>(n) * 4.0 / t);  // rep 0 warms up
  }
  if (!(total > 0)) throw std::logic_error("measure_read_rate: the read pass summed wrong");
  return best;
}

double measure_product_rate(c10::Device device) {
  at::NoGradGuard no_grad;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor a = at::ones({1024, 1024}, f32), b = at::ones({1024, 1024}, f32);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const double t = seconds(device, [&] { (void)at::mm(a, b); });
    if (rep > 0 && t > 0) best = std::max(best, 2.0 * 1024.0 * 1024.0 * 1024.0 / t);
  }
  return best;
}

MachineInfo MachineInfo::current(c10::Device device) {
  MachineInfo m;
  m.cpu = cpu_model();
  m.libtorch = libtorch_version();
  m.blas = loaded_blas();
  const BlasInfo b = blas_info();
  m.blas_core = b.core.empty() ? b.library : b.core + " (chosen by " + b.chosen_by + ")";
  m.kernels = to_string(kernel_path());
  m.reference_blas = m.blas.find("/blas/libblas") != std::string::npos;  // Debian's reference BLAS
  m.threads = at::get_num_threads();
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spins = std::getenv("GOMP_SPINCOUNT");
  m.wait_policy = std::string(policy && *policy ? policy : "OpenMP's default") +
                  (spins && *spins ? std::string(", GOMP_SPINCOUNT=") + spins : std::string());
  m.device = device.str();
  return m;
}

nlohmann::json MachineInfo::to_json() const {
  return {{"cpu", cpu},           {"threads", threads}, {"wait_policy", wait_policy}, {"libtorch", libtorch}, {"blas", blas},
          {"blas_core", blas_core}, {"kernels", kernels}, {"reference_blas", reference_blas}, {"device", device},
          {"product_flops_s", product_flops_s}};
}

// SPEC 7's K and V bytes at a full window, batch 1: 2 x layers x tokens x G x hd x 4 (the seed's G x hd
// is d_model; a sliding layer keeps w - 1 tokens, SPEC 10).
static int64_t kv_formula_bytes(const Config& cfg) {
  int64_t tokens = 0;
  for (int64_t l = 0; l < cfg.n_layers; ++l) tokens += cfg.cache_window(l);
  return 2 * tokens * cfg.kv_heads() * cfg.head_dim() * 4;
}

BenchReport run_bench(GPT& model, const BenchOptions& opts, const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) { if (progress) progress(s); };
  const Config& cfg = model->config();
  const c10::Device dev = model->emb->weight.device();
  if (opts.prompt_len < 1 || opts.prompt_len > cfg.context)
    throw std::invalid_argument("bench: the prompt length must be in [1, " + std::to_string(cfg.context) + "]");
  for (int64_t b : opts.batches)
    if (b < 1) throw std::invalid_argument("bench: --batch values must be >= 1");
  for (int64_t t : opts.tokens)
    if (t < 1) throw std::invalid_argument("bench: --tokens values must be >= 1");
  std::vector<const CacheVariant*> variants;
  for (const auto& name : opts.caches) {
    const CacheVariant* v = &cache_registry().get(name);
    const std::string why = v->unsupported(cfg);  // a fast cache refuses a zoo member's knob (SPEC 10)
    if (why.empty()) variants.push_back(v);
    else say("cache " + name + " left out: " + why);
  }
  if (variants.empty()) throw std::invalid_argument("bench: none of the caches asked for runs this model (see above)");
  for (int t : opts.thread_counts)
    if (t < 1) throw std::invalid_argument("bench: thread counts must be >= 1");
  at::NoGradGuard no_grad;
  BenchReport rep;
  rep.machine = MachineInfo::current(dev);
  const int threads_before = at::get_num_threads();
  struct Restore {  // the threads in force before, whatever happens in the sweep
    int n;
    ~Restore() { set_threads(n); }
  } restore{threads_before};
  const std::vector<int> counts = opts.thread_counts.empty() ? std::vector<int>{threads_before} : opts.thread_counts;
  for (int count : counts) {
    set_threads(count);
    const std::string at_threads = counts.size() > 1 ? " at " + std::to_string(count) + " thread" + (count > 1 ? "s" : "") : "";
    say("measuring this machine's product rate" + at_threads);
    const double product_flops_s = measure_product_rate(dev);
    if (count == counts.front()) rep.machine.product_flops_s = product_flops_s;
    // The read rate depends on how much a step touches (cache-sized or not): measured per cell, over
    // the bytes of the cell's average step.
    // Returns (read rate, bound tok/s) of the cell.
    auto bound = [&](int64_t batch, int64_t n) {
      say("batch " + std::to_string(batch) + ", " + std::to_string(n) + " tokens: this machine's bound");
      const auto steps = run_step_costs(cfg, batch, opts.prompt_len, n);
      double bytes = 0;
      for (const auto& c : steps) bytes += c.bytes;
      const double read = measure_read_rate(dev, static_cast<int64_t>(bytes / static_cast<double>(steps.size())));
      return std::make_pair(read, static_cast<double>(batch * n) / run_bound_seconds(steps, read, product_flops_s));
    };
    for (int64_t batch : opts.batches) {
      at::Generator gen = at::detail::createCPUGenerator(opts.prompt_seed);
      const at::Tensor prompt = at::randint(0, cfg.vocab_size, {batch, opts.prompt_len}, gen, at::kLong).to(dev);
      say("batch " + std::to_string(batch) + ": warm-up");
      if (opts.uncached) generate_uncached(model, prompt, opts.warmup, greedy());
      std::vector<Decoder> decoders;
      for (const auto* v : variants) {
        decoders.push_back(v->decoder(cfg));
        generate_cached(model, prompt, opts.warmup, greedy(), *decoders.back().cache, decoders.back().path);
      }
      for (int64_t n : opts.tokens) {
        double slow = 0;
        if (opts.uncached) {
          say("batch " + std::to_string(batch) + ", " + std::to_string(n) + " tokens: uncached");
          slow = seconds(dev, [&] { generate_uncached(model, prompt, n, greedy()); });
        }
        const auto [read_bytes_s, bound_tok_s] = bound(batch, n);
        for (size_t i = 0; i < variants.size(); ++i) {
          say("batch " + std::to_string(batch) + ", " + std::to_string(n) + " tokens: " + variants[i]->name);
          const double fast = seconds(dev, [&] { generate_cached(model, prompt, n, greedy(), *decoders[i].cache, decoders[i].path); });
          BenchRow row{variants[i]->name, batch, n, count, 0, static_cast<double>(batch * n) / fast, 0};
          if (opts.uncached) {
            row.uncached_tok_s = static_cast<double>(batch * n) / slow;
            row.speedup = slow / fast;
          }
          row.bound_tok_s = bound_tok_s;
          row.read_bytes_s = read_bytes_s;
          rep.rows.push_back(row);
        }
      }
    }
  }
  // What each cache holds once the window is full, at batch 1, against 2 x layers x tokens x d x 4.
  for (const auto* v : variants) {
    Decoder d = v->decoder(cfg);
    decode_step(*model, at::zeros({1, cfg.context}, at::TensorOptions().dtype(at::kLong).device(dev)), *d.cache, 0, d.path);
    rep.memory.push_back({v->name, d.cache->bytes(), d.cache->capacity_bytes(), kv_formula_bytes(cfg)});
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  rep.peak_rss_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
  return rep;
}

nlohmann::json BenchReport::to_json() const {
  nlohmann::json r = nlohmann::json::array(), m = nlohmann::json::array();
  for (const auto& x : rows)
    r.push_back({{"cache", x.cache}, {"batch", x.batch}, {"tokens", x.tokens}, {"threads", x.threads}, {"uncached_tok_s", x.uncached_tok_s},
                 {"cached_tok_s", x.cached_tok_s}, {"speedup", x.speedup}, {"bound_tok_s", x.bound_tok_s},
                 {"read_bytes_s", x.read_bytes_s}});
  for (const auto& x : memory) {
    m.push_back({{"cache", x.cache}, {"cache_bytes", x.bytes}, {"capacity_bytes", x.capacity_bytes}, {"formula_bytes", x.formula_bytes}});
    for (auto& row : r)
      if (row["cache"] == x.cache) row["cache_bytes"] = x.bytes, row["formula_bytes"] = x.formula_bytes;
  }
  return {{"machine", machine.to_json()}, {"rows", r}, {"memory", m}, {"peak_rss_bytes", peak_rss_bytes}};
}

std::string BenchReport::format() const {
  std::ostringstream s;
  bool sweep = false;  // cells at several thread counts: a column for it, and what the extra threads bought
  for (const auto& r : rows) sweep |= r.threads != rows.front().threads;
  s << "machine: " << machine.cpu << ", " << machine.threads << " threads (idle threads wait: " << machine.wait_policy
    << "), LibTorch " << machine.libtorch << ", BLAS " << machine.blas << ", device " << machine.device << "\n";
  if (machine.reference_blas)
    s << "WARNING: LibTorch runs on reference BLAS: install libopenblas0-openmp (products ~17x slower)\n";
  char line[200];
  std::snprintf(line, sizeof line, "%-10s %5s %6s%s %15s %12s %8s %12s %9s\n", "cache", "batch", "tokens", sweep ? " threads" : "",
                "no cache tok/s", "cache tok/s", "speedup", "bound tok/s", "of bound");
  s << line;
  for (const auto& r : rows) {
    char unc[32] = "-", sp[16] = "-", bd[32] = "-", of[16] = "-";
    if (r.uncached_tok_s > 0) {
      std::snprintf(unc, sizeof unc, "%.0f", r.uncached_tok_s);
      std::snprintf(sp, sizeof sp, "%.1fx", r.speedup);
    }
    if (r.bound_tok_s > 0) {
      std::snprintf(bd, sizeof bd, "%.0f", r.bound_tok_s);
      std::snprintf(of, sizeof of, "%.0f%%", 100.0 * r.cached_tok_s / r.bound_tok_s);
    }
    char th[16] = "";
    if (sweep) std::snprintf(th, sizeof th, " %7d", r.threads);
    std::snprintf(line, sizeof line, "%-10s %5lld %6lld%s %15s %12.0f %8s %12s %9s\n", r.cache.c_str(),
                  static_cast<long long>(r.batch), static_cast<long long>(r.tokens), th, unc, r.cached_tok_s, sp, bd, of);
    s << line;
  }
  if (sweep) {  // each cell against itself at the sweep's first thread count
    const int first = rows.front().threads;
    for (const auto& r : rows) {
      if (r.threads == first) continue;
      for (const auto& b : rows)
        if (b.threads == first && b.cache == r.cache && b.batch == r.batch && b.tokens == r.tokens && b.cached_tok_s > 0) {
          std::snprintf(line, sizeof line, "threads: %s batch %lld, %lld tokens: %d threads %.2fx the speed of %d\n", r.cache.c_str(),
                        static_cast<long long>(r.batch), static_cast<long long>(r.tokens), r.threads, r.cached_tok_s / b.cached_tok_s,
                        first);
          s << line;
        }
    }
  }
  if (machine.product_flops_s > 0) {
    s << "bound: per step max(bytes read / read rate, FLOPs / product rate), measured here: products "
      << static_cast<long long>(machine.product_flops_s / 1e9 + 0.5) << " GFLOP/s (1024^3 matmul); reads";
    std::vector<std::pair<int64_t, int64_t>> cells;  // each (batch, tokens) once: the caches share a cell's rate
    for (const auto& r : rows)
      if (r.read_bytes_s > 0 && std::find(cells.begin(), cells.end(), std::make_pair(r.batch, r.tokens)) == cells.end()) {
        cells.emplace_back(r.batch, r.tokens);
        std::snprintf(line, sizeof line, "%s %.1f GB/s (batch %lld, %lld tokens)", cells.size() > 1 ? "," : "",
                      r.read_bytes_s / 1e9, static_cast<long long>(r.batch), static_cast<long long>(r.tokens));
        s << line;
      }
    s << "\n";
  }
  for (const auto& m : memory)
    s << "cache " << m.cache << " at a full window, batch 1: " << human_bytes(m.bytes) << " of K and V (formula 2 x layers x "
      << "tokens x KV heads x head size x 4 bytes = " << human_bytes(m.formula_bytes) << "), " << human_bytes(m.capacity_bytes)
      << " allocated\n";
  s << "peak resident memory: " << human_bytes(peak_rss_bytes) << "\n";
  return s.str();
}

StepProfile profile_step(GPT& model, const std::string& cache_name, int64_t context_fill, int64_t batch) {
  const CacheVariant& v = cache_registry().get(cache_name);
  const Config& cfg = model->config();
  const c10::Device dev = model->emb->weight.device();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  const int64_t d = cfg.d_model, H = cfg.n_heads, hd = cfg.head_dim(), reps = 200;
  if (context_fill < 1 || context_fill > cfg.context) throw std::invalid_argument("profile: fill must be in [1, context]");
  if (batch < 1) throw std::invalid_argument("profile: batch must be >= 1");
  const int64_t B = batch;
  at::NoGradGuard no_grad;
  StepProfile p;
  p.cache = cache_name;
  p.batch = B;
  auto timed = [&](auto&& f) {
    f();
    return seconds(dev, [&] { for (int64_t i = 0; i < reps; ++i) f(); }) / reps * 1e6;  // us per call of f
  };
  // The whole step on a cache filled to `context_fill`, positions growing as in generation.
  Decoder dec = v.decoder(cfg);
  const DecodePath& path = dec.path;
  const at::Tensor tok = at::ones({B, 1}, at::TensorOptions().dtype(at::kLong).device(dev));
  decode_step(*model, at::ones({B, context_fill}, tok.options()), *dec.cache, 0, path);
  int64_t pos = context_fill;
  if (auto* fused = dynamic_cast<FusedCpuStep*>(dec.step.get())) {
    // The fused step times its own parts inside the real steps.
    FusedStepProfile inside;
    decode_step(*model, tok, *dec.cache, pos++, path);
    fused->set_profile(&inside);
    p.step_us = seconds(dev, [&] { for (int64_t i = 0; i < reps; ++i) decode_step(*model, tok, *dec.cache, pos++, path); }) / reps * 1e6;
    fused->set_profile(nullptr);
    if (inside.steps == reps) {  // else the step fell back to the model's (a GPU, a batch too large)
      p.inside_step = true;
      double sum = 0;
      for (int i = 0; i < FusedStepProfile::kParts; ++i) {
        const double us = inside.seconds[static_cast<size_t>(i)] / static_cast<double>(reps) * 1e6;
        p.parts_us.emplace_back(FusedStepProfile::name(static_cast<FusedStepProfile::Part>(i)), us);
        sum += us;
      }
      p.parts_us.emplace_back("rest (outside the fused step's parts)", std::max(0.0, p.step_us - sum));
      return p;
    }
  } else {
    p.step_us = timed([&] { decode_step(*model, tok, *dec.cache, pos++, path); });
  }
  // Each part with the step's shapes, summed over the layers.
  std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor>> products;  // (input, weight, bias)
  for (const auto& m : *model->blocks) {
    auto* b = m->as<BlockImpl>();
    products.emplace_back(at::randn({B, 1, d}, f32), b->attn->qkv->weight, at::Tensor());
    products.emplace_back(at::randn({B, 1, d}, f32), b->attn->out->weight, at::Tensor());
    products.emplace_back(at::randn({B, 1, d}, f32), b->up->weight, b->up->bias);
    products.emplace_back(at::randn({B, 1, 4 * d}, f32), b->down->weight, b->down->bias);
  }
  products.emplace_back(at::randn({B, d}, f32), model->emb->weight, at::Tensor());
  p.parts_us.emplace_back("weight products (4 per layer + head)", timed([&] {
    for (auto& [x, w, b] : products) project(x, w, b, path.kernels);
  }));
  const int64_t S = std::min(cfg.context + 1, context_fill + 1);
  const at::Tensor q = at::randn({B, H, 1, hd}, f32), K = at::randn({B, H, S, hd}, f32), V = at::randn({B, H, S, hd}, f32);
  p.parts_us.emplace_back("attention (" + std::to_string(S) + " keys)", timed([&] {
    for (int64_t l = 0; l < cfg.n_layers; ++l) attend(q, K, V, {}, path.kernels);
  }));
  const at::Tensor x = at::randn({B, 1, d}, f32), w = at::ones({d}, f32), b = at::zeros({d}, f32);
  p.parts_us.emplace_back("layer norms (2 per layer + final)", timed([&] {
    for (int64_t l = 0; l < 2 * cfg.n_layers + 1; ++l) layer_norm(x, w, b, 1e-5, path.kernels);
  }));
  at::Tensor qq = at::randn({B, H, 1, hd}, f32), kk = at::randn({B, H, 1, hd}, f32), vv = at::randn({B, H, 1, hd}, f32);
  const auto rotary = make_rotary(cfg);
  p.parts_us.emplace_back("RoPE on q and k", timed([&] {
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      at::Tensor a = qq, c = kk, e = vv;
      path.policy->position(a, c, e, 300, *rotary);
    }
  }));
  auto store = v.make_cache(cfg);
  for (int64_t l = 0; l < cfg.n_layers; ++l) store->update(l, at::randn({B, H, context_fill, hd}, f32), at::randn({B, H, context_fill, hd}, f32));
  p.parts_us.emplace_back("cache update (append, trim)", timed([&] {
    for (int64_t l = 0; l < cfg.n_layers; ++l) store->update(l, kk, vv);
  }));
  double sum = 0;
  for (const auto& [name, us] : p.parts_us) sum += us;
  p.parts_us.emplace_back("rest (dispatch, embedding; parts slower in a step)", std::max(0.0, p.step_us - sum));
  return p;
}

nlohmann::json StepProfile::to_json() const {
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& [name, us] : parts_us) parts.push_back({{"part", name}, {"us", us}});
  return {{"cache", cache}, {"batch", batch}, {"step_us", step_us}, {"parts", parts}, {"timed_inside_step", inside_step}};
}

std::string StepProfile::format() const {
  std::ostringstream s;
  char line[160];
  std::snprintf(line, sizeof line, "batch-%lld decode step, cache %s: %.0f us (%.0f tok/s)\n", static_cast<long long>(batch),
                cache.c_str(), step_us, 1e6 * static_cast<double>(batch) / step_us);
  s << line;
  s << (inside_step ? "  (each part timed inside the real steps)\n" : "  (each part timed alone with the step's shapes; the rest includes what they lose inside a step)\n");
  for (const auto& [name, us] : parts_us) {
    std::snprintf(line, sizeof line, "  %-50s %8.0f us  %5.1f%%\n", name.c_str(), us, 100.0 * us / step_us);
    s << line;
  }
  return s.str();
}

}  // namespace tinygpt::tools

// ---- ours against an engine's own loop ---------------------------------------------------------

namespace tinygpt::tools {

namespace {

// The decode steps' costs (the prefill left out: neither side's timing includes it) and their
// average bytes, the size the read rate is measured at.
std::pair<std::vector<StepCost>, int64_t> decode_costs(const Config& cfg, int64_t batch, int64_t prompt_len, int64_t steps) {
  std::vector<StepCost> costs = run_step_costs(cfg, batch, prompt_len, steps + 1);
  costs.erase(costs.begin());
  double bytes = 0;
  for (const auto& c : costs) bytes += c.bytes;
  return {costs, static_cast<int64_t>(bytes / static_cast<double>(costs.size()))};
}

}  // namespace

VsEngineReport run_vs_engine(LoadedEngine& engine, const std::string& command, const VsEngineOptions& o,
                             const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  GPT& model = engine.model();
  const Config& cfg = model->config();
  const c10::Device dev(c10::kCPU);
  if (o.prompt_len < 1 || o.steps < 1 || o.prompt_len + o.steps > cfg.context)
    throw std::invalid_argument("bench --vs-engine: the prompt and the decode steps must fit the window (" +
                                std::to_string(o.prompt_len) + " + " + std::to_string(o.steps) + " > " + std::to_string(cfg.context) + ")");
  if (o.reps < 1) throw std::invalid_argument("bench --vs-engine: reps must be >= 1");
  for (int64_t b : o.batches)
    if (b < 1 || b > 16) throw std::invalid_argument("bench --vs-engine: batch sizes 1 to 16 (protocol engines keep 16 rows)");
  if (!engine.supports("bench"))
    throw EngineUnusable("engine '" + engine.name() + "' does not time its own decode: its hello lists no 'bench' operation "
                         "(protocol 2, docs/protocol.md)");
  const CacheVariant& variant = cache_registry().get(o.cache);
  at::NoGradGuard no_grad;
  const int threads = at::get_num_threads();

  VsEngineReport rep;
  rep.machine = MachineInfo::current(dev);
  rep.engine = engine.name();
  rep.command = command;
  rep.cache = o.cache;
  rep.checkpoint = engine.checkpoint();
  rep.prompt_len = o.prompt_len;
  rep.reps = o.reps;
  say("measuring this machine's product rate");
  rep.machine.product_flops_s = measure_product_rate(dev);

  // The engine's loop, timed by the engine: (tok/s, its greedy tokens (B, n + 1)).
  auto engine_run = [&](const at::Tensor& prompt, int64_t n) {
    nlohmann::json ids = nlohmann::json::array();
    for (int64_t b = 0; b < prompt.size(0); ++b) {
      std::vector<int64_t> row(prompt[b].data_ptr<int64_t>(), prompt[b].data_ptr<int64_t>() + prompt.size(1));
      ids.push_back(row);
    }
    const nlohmann::json a = engine.call({{"op", "bench"}, {"ids", ids}, {"n", n}, {"threads", threads}});
    if (!a.value("ok", false)) throw EngineUnusable("engine: 'bench' answered ok false: " + a.value("error", std::string()));
    try {
      const double s = a.at("decode_s").get<double>();
      std::vector<int64_t> flat;
      for (const auto& row : a.at("ids")) {
        const auto r = row.get<std::vector<int64_t>>();
        if (static_cast<int64_t>(r.size()) != n + 1) throw std::runtime_error("a row of " + std::to_string(r.size()) + " ids");
        flat.insert(flat.end(), r.begin(), r.end());
      }
      if (static_cast<int64_t>(flat.size()) != prompt.size(0) * (n + 1) || !(s > 0)) throw std::runtime_error("wrong shape or time");
      return std::make_pair(static_cast<double>(prompt.size(0) * n) / s, at::tensor(flat, at::kLong).view({prompt.size(0), n + 1}));
    } catch (const std::exception& e) {
      throw EngineUnusable(std::string("engine: 'bench' answer is not {decode_s, ids: B rows of n + 1}: ") + e.what());
    }
  };
  // Ours, timed the same way: from the first choice after the prefill to the end of the loop.
  Decoder dec = variant.decoder(cfg);
  auto ours_run = [&](const at::Tensor& prompt, int64_t n) {
    std::chrono::steady_clock::time_point t0;
    const at::Tensor seq = generate_cached(model, prompt, n + 1, greedy(), *dec.cache, dec.path, [&](int64_t i, const at::Tensor&) {
      if (i == 0) t0 = std::chrono::steady_clock::now();
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::make_pair(static_cast<double>(prompt.size(0) * n) / s, seq.narrow(1, prompt.size(1), n + 1));
  };

  for (int64_t batch : o.batches) {
    at::Generator gen = at::detail::createCPUGenerator(o.prompt_seed);
    const at::Tensor prompt = at::randint(0, cfg.vocab_size, {batch, o.prompt_len}, gen, at::kLong);  // (B, P)
    say("batch " + std::to_string(batch) + ": warm-up");
    engine_run(prompt, 16);
    ours_run(prompt, 16);
    VsEngineRow row;
    row.batch = batch;
    row.steps = o.steps;
    at::Tensor ours_ids, engine_ids;
    // The read rate is measured between the runs, every rep, and the best counts: the host's memory
    // rate moves from minute to minute, and a bound taken in a slow minute was below runs taken in
    // a fast one.
    const auto [costs, step_bytes] = decode_costs(cfg, batch, o.prompt_len, o.steps);
    double read_rate = 0;
    for (int r = 0; r < o.reps; ++r) {
      say("batch " + std::to_string(batch) + ": run " + std::to_string(r + 1) + " of " + std::to_string(o.reps));
      auto [e, eids] = engine_run(prompt, o.steps);
      read_rate = std::max(read_rate, measure_read_rate(dev, step_bytes));
      auto [u, uids] = ours_run(prompt, o.steps);
      row.engine_runs.push_back(e);
      row.ours_runs.push_back(u);
      engine_ids = eids;
      ours_ids = uids;
    }
    row.engine_tok_s = *std::max_element(row.engine_runs.begin(), row.engine_runs.end());
    row.ours_tok_s = *std::max_element(row.ours_runs.begin(), row.ours_runs.end());
    row.ratio = row.ours_tok_s / row.engine_tok_s;
    row.tokens = ours_ids.numel();
    // Each row's tokens agree up to where they first part (after that, each follows its own text).
    for (int64_t b = 0; b < batch; ++b) {
      int64_t i = 0;
      while (i < ours_ids.size(1) && ours_ids[b][i].item<int64_t>() == engine_ids[b][i].item<int64_t>()) ++i;
      row.tokens_agree += i;
    }
    row.bound_tok_s = static_cast<double>(batch * o.steps) / run_bound_seconds(costs, read_rate, rep.machine.product_flops_s);
    rep.rows.push_back(row);
  }
  return rep;
}

nlohmann::json VsEngineReport::to_json() const {
  nlohmann::json r = nlohmann::json::array();
  for (const auto& x : rows)
    r.push_back({{"batch", x.batch}, {"steps", x.steps}, {"ours_tok_s", x.ours_tok_s}, {"engine_tok_s", x.engine_tok_s},
                 {"ratio", x.ratio}, {"ours_runs_tok_s", x.ours_runs}, {"engine_runs_tok_s", x.engine_runs},
                 {"bound_tok_s", x.bound_tok_s}, {"tokens_agree", x.tokens_agree}, {"tokens", x.tokens}});
  return {{"machine", machine.to_json()}, {"engine", engine}, {"command", command}, {"cache", cache},
          {"checkpoint", checkpoint}, {"prompt_len", prompt_len}, {"reps", reps}, {"rows", r}};
}

std::string VsEngineReport::format() const {
  std::ostringstream s;
  s << "machine: " << machine.cpu << ", " << machine.threads << " threads, LibTorch " << machine.libtorch << ", BLAS "
    << machine.blas << "\n";
  s << "ours (cache " << cache << ") against engine '" << engine << "': greedy from " << prompt_len
    << "-token prompts, decode steps only (the engine times its own loop), best of " << reps << " interleaved runs\n";
  char line[256];
  std::snprintf(line, sizeof line, "%5s %6s %11s %13s %12s %12s %9s %11s %13s\n", "batch", "steps", "ours tok/s",
                "engine tok/s", "ours/engine", "bound tok/s", "ours of", "engine of", "same tokens");
  s << line;
  for (const auto& r : rows) {
    char same[48];
    std::snprintf(same, sizeof same, "%lld/%lld", static_cast<long long>(r.tokens_agree), static_cast<long long>(r.tokens));
    std::snprintf(line, sizeof line, "%5lld %6lld %11.0f %13.0f %11.2fx %12.0f %8.0f%% %10.0f%% %13s\n",
                  static_cast<long long>(r.batch), static_cast<long long>(r.steps), r.ours_tok_s, r.engine_tok_s, r.ratio,
                  r.bound_tok_s, 100.0 * r.ours_tok_s / r.bound_tok_s, 100.0 * r.engine_tok_s / r.bound_tok_s, same);
    s << line;
  }
  s << "bound: per step max(bytes read / read rate, FLOPs / product rate), measured here; 'same tokens': greedy tokens "
       "equal before each row's first difference\n";
  return s.str();
}

}  // namespace tinygpt::tools
