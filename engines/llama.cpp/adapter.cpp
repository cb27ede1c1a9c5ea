// llama.cpp under `tinygpt conform` (docs/protocol.md): our model as llama.cpp's gptneox architecture
// (the GGUF `tinygpt export --format gguf` writes), driven through libllama's C API.
//  - one llama sequence per row (n_seq_max rows, not unified), F32 K and V, flash attention off, one
//    thread (ggml's threads spin: two on two shared cores made a batch check 50x slower);
//  - positions keep growing; SPEC 4's window: after each decode every sequence keeps its last
//    `context` positions (llama_memory_seq_rm on the head); reset clears the memory;
//  - logits of each row's last token through llama_get_logits_ith;
//  - `sample` through llama.cpp's own samplers: penalties (per row, its history accepted), then
//    temperature, top-k, top-p and dist seeded with the request's seed (greedy at temperature 0).
// `hello` declares what llama.cpp does differently: gelu-tanh (ggml_gelu; not in a build whose
// build_ffn calls ggml_gelu_erf, compiled with TINYGPT_EXACT_GELU), top-k-exact, rope-angle-recurrence.
//
// Planted faults for the suite's tests (TINYGPT_ENGINE_FAULT): rope-permutation-skipped (the GGUF's
// q/k rows put back in our order: llama.cpp's rotate-half RoPE then pairs the wrong channels),
// no-reset, never-trimmed, one-entry-too-few, context-shift-keeps-prompt (llama.cpp's context shift:
// the first tokens stay, the ones after them go), f16-cache.
#include <dlfcn.h>
#include <gguf.h>
#include <ggml-backend.h>
#include <llama.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using nlohmann::json;

namespace {

const std::set<std::string> kFaults = {"", "rope-permutation-skipped", "no-reset", "never-trimmed", "one-entry-too-few",
                                       "context-shift-keeps-prompt", "f16-cache"};
constexpr int kMaxRows = 16;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

#ifdef TINYGPT_EXACT_GELU
constexpr bool kExactGelu = true;
#else
constexpr bool kExactGelu = false;
#endif

// The folder of the libllama this program runs with: its CPU backends (one per instruction set) are
// loaded from there at run time.
std::string lib_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&llama_backend_init), &info) && info.dli_fname) {
    std::string p = info.dli_fname;
    const auto slash = p.rfind('/');
    if (slash != std::string::npos) return p.substr(0, slash);
  }
  return ".";
}

// Copies `src` to `dst` with each attn_qkv tensor's q and k rows put back in our interleaved order
// (the inverse of the exporter's permutation): the planted "permutation skipped".
void unpermute(const std::string& src, const std::string& dst, int64_t heads) {
  std::ifstream in(src, std::ios::binary);
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gguf_init_params p{/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context* g = gguf_init_from_file(src.c_str(), p);
  if (!g) throw std::runtime_error("cannot read " + src);
  const size_t base = gguf_get_data_offset(g);
  for (int64_t t = 0; t < gguf_get_n_tensors(g); ++t) {
    const std::string name = gguf_get_tensor_name(g, t);
    if (name.find("attn_qkv.weight") == std::string::npos) continue;
    const int64_t* ne = gguf_get_tensor_ne(g, t);
    const int64_t cols = ne[0], rows = ne[1], d = rows / 3, hd = d / heads;
    float* w = reinterpret_cast<float*>(data.data() + base + gguf_get_tensor_offset(g, t));
    std::vector<float> copy(w, w + rows * cols);
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < hd / 2; ++j) {
          const int64_t b = part * d + h * hd;
          std::memcpy(w + (b + 2 * j) * cols, copy.data() + (b + j) * cols, cols * sizeof(float));
          std::memcpy(w + (b + 2 * j + 1) * cols, copy.data() + (b + hd / 2 + j) * cols, cols * sizeof(float));
        }
  }
  gguf_free(g);
  std::ofstream out(dst, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) throw std::runtime_error("cannot write " + dst);
}

class Engine {
 public:
  explicit Engine(std::string fault) : fault_(std::move(fault)) {}
  ~Engine() { unload(); }

  json hello() const {
    json dev = json::array({"top-k-exact", "rope-angle-recurrence"});
    if (!kExactGelu) dev.push_back("gelu-tanh");
    std::string name = std::string("llama.cpp v0.4.0") + (kExactGelu ? " with exact GELU" : " (prebuilt)");
    if (!fault_.empty()) name += " (fault " + fault_ + ")";
    return {{"ok", true}, {"name", name}, {"formats", {"gguf"}}, {"deviations", dev}};
  }

  void load(const json& req) {
    if (req.value("format", "") != "gguf") throw std::runtime_error("this adapter loads format gguf only");
    unload();
    const json cfg = req.value("config", json::object());
    context_ = cfg.value("context", 256);
    std::string path = req.at("checkpoint").get<std::string>();
    if (fault_ == "rope-permutation-skipped") {
      const std::string patched = path + ".unpermuted.gguf";
      unpermute(path, patched, cfg.value("n_heads", 4));
      path = patched;
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    model_ = llama_model_load_from_file(path.c_str(), mp);
    if (!model_) throw std::runtime_error("llama_model_load_from_file failed on " + path);
    llama_context_params cp = llama_context_default_params();
    cp.n_seq_max = kMaxRows;
    cp.kv_unified = false;
    cp.n_ctx = static_cast<uint32_t>(kMaxRows * 512);  // 512 cells per sequence: context + 1 fit
    cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(kMaxRows * context_);
    cp.n_threads = cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = fault_ == "f16-cache" ? GGML_TYPE_F16 : GGML_TYPE_F32;
    cp.no_perf = true;
    ctx_ = llama_init_from_model(model_, cp);
    if (!ctx_) throw std::runtime_error("llama_init_from_model failed");
    n_vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model_));
    if (n_vocab_ <= 0) n_vocab_ = cfg.value("vocab_size", 4096);
    reset(true);
  }

  void reset(bool really = false) {
    if (!ctx_) throw std::runtime_error("no model loaded");
    if (fault_ == "no-reset" && !really) return;
    llama_memory_clear(llama_get_memory(ctx_), true);
    pos_.assign(kMaxRows, 0);
    prompt_.assign(kMaxRows, 0);
  }

  // rows of ids (a prefill: positions from 0; a step: one id per row at its next position).
  json run(const json& ids, bool step) {
    if (!ctx_) throw std::runtime_error("no model loaded");
    const int rows = static_cast<int>(ids.size());
    if (rows < 1 || rows > kMaxRows) throw std::runtime_error("1 to " + std::to_string(kMaxRows) + " rows");
    int total = 0;
    for (const auto& r : ids) total += static_cast<int>(r.size());
    llama_batch batch = llama_batch_init(total, 0, 1);
    std::vector<int> last(rows);
    int k = 0;
    for (int b = 0; b < rows; ++b) {
      const auto& r = ids[b];
      if (r.empty() || (step && r.size() != 1)) {
        llama_batch_free(batch);
        throw std::runtime_error("a step takes one id per row, a prefill at least one");
      }
      if (!step) {  // a prefill is at positions 0..T-1: on a sequence `reset` did not clear, llama_decode refuses it
        pos_[b] = 0;
        prompt_[b] = static_cast<int>(r.size());
      }
      for (size_t i = 0; i < r.size(); ++i, ++k) {
        batch.token[k] = r[i].get<int>();
        batch.pos[k] = pos_[b]++;
        batch.n_seq_id[k] = 1;
        batch.seq_id[k][0] = b;
        batch.logits[k] = i + 1 == r.size();
      }
      last[b] = k - 1;
    }
    batch.n_tokens = total;
    const int rc = llama_decode(ctx_, batch);
    llama_batch_free(batch);
    if (rc != 0) throw std::runtime_error("llama_decode returned " + std::to_string(rc));
    json out = json::array();
    for (int b = 0; b < rows; ++b) {
      const float* l = llama_get_logits_ith(ctx_, last[b]);
      if (!l) throw std::runtime_error("no logits for row " + std::to_string(b));
      out.push_back(std::vector<float>(l, l + n_vocab_));
    }
    for (int b = 0; b < rows; ++b) trim(b);
    return out;
  }

  json sample(const json& req) const {
    const auto& rows = req.at("logits");
    const auto& hist = req.value("history", json::array());
    const double t = req.at("temperature").get<double>(), p = req.at("top_p").get<double>(), r = req.at("penalty").get<double>();
    const int top_k = req.at("top_k").get<int>(), n = req.at("n").get<int>();
    const uint32_t seed = static_cast<uint32_t>(req.at("seed").get<int64_t>());
    // Temperature, top-k, top-p and the draw: one chain, seeded once, shared by the rows.
    llama_sampler* chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (t == 0) {
      llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    } else {
      llama_sampler_chain_add(chain, llama_sampler_init_temp(static_cast<float>(t)));
      if (top_k > 0) llama_sampler_chain_add(chain, llama_sampler_init_top_k(top_k));
      if (p < 1) llama_sampler_chain_add(chain, llama_sampler_init_top_p(static_cast<float>(p), 1));
      llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
    }
    json out = json::array();
    for (size_t b = 0; b < rows.size(); ++b) {
      const auto& row = rows[b];
      const int V = static_cast<int>(row.size());
      std::vector<llama_token_data> base(V);
      for (int v = 0; v < V; ++v) {
        const auto& x = row[v];
        base[v] = {v, x.is_string() ? -INFINITY : x.get<float>(), 0.0f};
      }
      // The penalty: llama.cpp's penalties sampler over this row's history, applied once.
      std::vector<int> h;
      if (b < hist.size()) h = hist[b].get<std::vector<int>>();
      if (r != 1.0 && !h.empty()) {
        llama_sampler* pen = llama_sampler_init_penalties(V, static_cast<int32_t>(h.size()), static_cast<float>(r), 0.0f, 0.0f);
        for (int id : h) llama_sampler_accept(pen, id);
        llama_token_data_array arr{base.data(), base.size(), -1, false};
        llama_sampler_apply(pen, &arr);
        llama_sampler_free(pen);
        std::vector<llama_token_data> penalised(arr.data, arr.data + arr.size);
        std::sort(penalised.begin(), penalised.end(), [](const llama_token_data& a, const llama_token_data& c) { return a.id < c.id; });
        base = penalised;
      }
      json ids = json::array();
      for (int i = 0; i < n; ++i) {
        std::vector<llama_token_data> cur = base;
        llama_token_data_array arr{cur.data(), cur.size(), -1, false};
        llama_sampler_apply(chain, &arr);
        if (arr.selected < 0 || static_cast<size_t>(arr.selected) >= arr.size) {
          llama_sampler_free(chain);
          throw std::runtime_error("the sampler chain selected nothing");
        }
        ids.push_back(arr.data[arr.selected].id);
      }
      out.push_back(ids);
    }
    llama_sampler_free(chain);
    return out;
  }

 private:
  // SPEC 4's window on sequence b: keep its last `context` positions.
  void trim(int b) {
    if (fault_ == "never-trimmed") return;
    llama_memory_t mem = llama_get_memory(ctx_);
    const int keep = fault_ == "one-entry-too-few" ? context_ - 1 : context_;
    if (pos_[b] <= keep) return;
    if (fault_ == "context-shift-keeps-prompt") {  // the prompt stays; the oldest tokens after it go
      llama_memory_seq_rm(mem, b, prompt_[b], pos_[b] - keep + prompt_[b]);
      return;
    }
    llama_memory_seq_rm(mem, b, 0, pos_[b] - keep);
  }

  void unload() {
    if (ctx_) llama_free(ctx_);
    if (model_) llama_model_free(model_);
    ctx_ = nullptr;
    model_ = nullptr;
  }

  std::string fault_;
  llama_model* model_ = nullptr;
  llama_context* ctx_ = nullptr;
  int context_ = 256, n_vocab_ = 0;
  std::vector<int> pos_, prompt_;  // per row: tokens fed (the next position), the prompt's length
};

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main() {
  const std::string fault = env("TINYGPT_ENGINE_FAULT");
  if (!kFaults.count(fault)) {
    std::fprintf(stderr, "llama.cpp adapter: unknown TINYGPT_ENGINE_FAULT %s\n", fault.c_str());
    return 2;
  }
  llama_log_set(quiet, nullptr);
  ggml_backend_load_all_from_path(lib_dir().c_str());
  llama_backend_init();
  Engine engine(fault);
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    json answer;
    try {
      const json req = json::parse(line);
      const std::string op = req.value("op", "");
      if (op == "quit") break;
      if (op == "hello") answer = engine.hello();
      else if (op == "load") engine.load(req), answer = {{"ok", true}};
      else if (op == "reset") engine.reset(), answer = {{"ok", true}};
      else if (op == "prefill") answer = {{"ok", true}, {"logits", engine.run(req.at("ids"), false)}};
      else if (op == "step") answer = {{"ok", true}, {"logits", engine.run(req.at("ids"), true)}};
      else if (op == "sample") answer = {{"ok", true}, {"ids", engine.sample(req)}};
      else answer = {{"ok", false}, {"error", "unknown op '" + op + "'"}};
    } catch (const std::exception& e) {
      answer = {{"ok", false}, {"error", e.what()}};
    }
    std::cout << answer.dump() << "\n" << std::flush;
  }
  llama_backend_free();
  return 0;
}
