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
// `load` takes "weight_type" (q8_0, q4_0, q4_K_M; f32 as written): the GGUF quantized by llama.cpp's
// own llama_model_quantize (what llama-quantize calls) before it is loaded, every 2-D weight whose rows
// the type's blocks divide; a width they cannot divide is refused by the tensor's name, where
// llama-quantize would quietly store that tensor as another type.
//
// Protocol 2 (rows by id): a row is a llama sequence; ragged prefills and rows joining are batches of
// new sequences at their own positions; fork is llama_memory_seq_cp, release and rollback
// llama_memory_seq_rm. A rollback past the window must bring back the entries the rejected tokens
// pushed out (SPEC 4's window over the remaining sequence), so the KV cache is unified and every
// row has a shadow sequence: trimming re-tags a row's oldest cells with its shadow instead of
// dropping them (the last kRollback of them kept), and a rollback tags them back. In a unified cache
// seq_cp and seq_rm only change which sequences a cell belongs to; no data moves.
//
// Protocol 3 through llama.cpp's own calls: `extend` is a multi-token llama_decode on one sequence
// (split into micro-batches of TINYGPT_LLAMA_UBATCH tokens when set: n_ubatch, where llama.cpp's
// chunked-prefill bugs have lived); `save`/`restore` are llama_state_seq_get_data/set_data (the
// row's cells, base64 in the answer, with its position); `shift` is llama.cpp's context shift,
// llama_memory_seq_rm of the span then llama_memory_seq_add of -discard on the later cells (the
// K-shift re-rotates their keys at the next decode); prefix reuse is llama-server's prompt cache
// through llama_memory_seq_cp: a released row's cells are kept under a pool sequence (kPool of them,
// the oldest given up first), and a new prompt sharing a prefix with one takes those cells (never
// the prompt's last token, whose logits are the answer) and computes the rest; the prefill answer
// says how many it reused.
//
// TINYGPT_LLAMA_TRACE=FILE: every llama.cpp call made to answer a request after `load` (the context's
// parameters, memory clears, seq_rm/seq_cp/seq_add, each llama_decode's batch, the logits read, the
// state saved and put back), one JSON object per line, each request's calls after a line naming it.
// engines/llama.cpp/repro_c.py writes a bundle's calls as a C program from it (a report that needs
// no adapter).
//
// Planted faults for the suite's tests (TINYGPT_ENGINE_FAULT): rope-permutation-skipped (the GGUF's
// q/k rows put back in our order: llama.cpp's rotate-half RoPE then pairs the wrong channels),
// no-reset, never-trimmed, one-entry-too-few, context-shift-keeps-prompt (llama.cpp's context shift:
// the first tokens stay, the ones after them go), f16-cache; and in the serving operations
// rollback-forgets-the-window (a rollback past the window leaves the evicted entries gone; an
// off-by-one in the rollback's positions cannot be planted quietly: llama_decode refuses a position
// that does not follow the sequence's last); shift-not-renumbered (the span dropped, the later
// cells left at their positions and the row's position with them: the kept first tokens end up
// `discard` positions further away than a shift puts them); reused-prefix-too-long (a prompt cached
// whole keeps every cell and feeds its last token again after them, one position on);
// shift-shares-cells (a row's cells shifted where a fork or a reused prefix still shares them: the
// other sequences' cells move with it); extend-last-token-dropped (a chunk's last cell is not kept:
// the next token takes its position, as ONNX Runtime GenAI's append-after-generate bug did);
// state-saved-in-part (a saved state without the row's oldest 16 cells, llama.cpp PR #5840's bug);
// state-saved-without-history (a saved state of the row's window alone, its shadow left out: a
// rollback after the restore has nothing to bring back - this adapter's own bug until
// rollback-after-restore found it);
// in `sample` with per-row seeds, first-seed-for-every-row (every row's chain seeded with the first's);
// and an exporter's mistakes on the zoo's paths (the file rewritten before llama.cpp reads it):
// kv-heads-interleaved (query head h in the group of KV head h % G), final-softcap-dropped.
#include <dlfcn.h>
#include <gguf.h>
#include <ggml-backend.h>
#include <llama.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using nlohmann::json;

namespace {

const std::set<std::string> kFaults = {"", "rope-permutation-skipped", "no-reset", "never-trimmed", "one-entry-too-few",
                                       "context-shift-keeps-prompt", "f16-cache", "rollback-forgets-the-window",
                                       "shift-not-renumbered", "reused-prefix-too-long", "shift-shares-cells",
                                       "extend-last-token-dropped", "state-saved-in-part", "first-seed-for-every-row",
                                       "state-saved-without-history", "kv-heads-interleaved", "final-softcap-dropped"};
constexpr int kMaxRows = 16;     // rows 0..15; row r's shadow is sequence kMaxRows + r
constexpr int kRollback = 64;    // evicted entries a row keeps for a rollback
constexpr int kPool = 8;
constexpr int kScratch = 2 * kMaxRows + kPool;  // a sequence for a planted fault's partial copy         // released rows kept for prefix reuse: sequences 2 kMaxRows ..

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A saved row's bytes in the protocol's JSON (definitions below).
std::string base64(const std::string& in);
std::string unbase64(const std::string& in);

#ifdef TINYGPT_EXACT_GELU
constexpr bool kExactGelu = true;
#else
constexpr bool kExactGelu = false;
#endif
// The release this adapter was built against: npm's prebuilt 0.4.0 unless the build names another
// (ci/engines.sh names forky's, e.g. "0.7.0 (Debian forky)").
#ifdef TINYGPT_LLAMA_VERSION
constexpr const char* kVersion = TINYGPT_LLAMA_VERSION;
constexpr const char* kBuild = "";
#else
constexpr const char* kVersion = "v0.4.0";
constexpr const char* kBuild = " (prebuilt)";
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

// A copy of `src` at `dst` as a faulty exporter writes it (the planted faults on the file):
//  - rope-permutation-skipped: each attn_qkv tensor's q and k rows put back in our interleaved order
//    (the inverse of the exporter's permutation);
//  - kv-heads-interleaved: each layer's query heads laid out so head h sits in the group of KV head
//    h % G, not h / (H / G) (attn_q's rows and attn_output's columns moved together, head by head);
//  - final-softcap-dropped: the final soft-cap written as 1e30, which leaves the logits as they were.
void plant_export_fault(const std::string& src, const std::string& dst, const std::string& fault) {
  std::ifstream in(src, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gguf_init_params p{/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context* g = gguf_init_from_file(src.c_str(), p);
  if (!g) throw std::runtime_error("cannot read " + src);
  const std::string arch = gguf_get_val_str(g, gguf_find_key(g, "general.architecture"));
  auto u32 = [&](const std::string& k) { return static_cast<int64_t>(gguf_get_val_u32(g, gguf_find_key(g, (arch + "." + k).c_str()))); };
  const size_t base = gguf_get_data_offset(g);
  auto tensor = [&](const std::string& name) {
    const int64_t t = gguf_find_tensor(g, name.c_str());
    if (t < 0) throw std::runtime_error(fault + ": no " + name);
    return reinterpret_cast<float*>(bytes.data() + base + gguf_get_tensor_offset(g, t));
  };
  const int64_t H = u32("attention.head_count"), layers = u32("block_count"), d = u32("embedding_length");
  if (fault == "rope-permutation-skipped") {
    for (int64_t l = 0; l < layers; ++l) {
      float* w = tensor("blk." + std::to_string(l) + ".attn_qkv.weight");  // 3 d rows of d
      const int64_t hd = d / H;
      const std::vector<float> copy(w, w + 3 * d * d);
      for (int64_t part = 0; part < 2; ++part)  // q, then k
        for (int64_t h = 0; h < H; ++h)
          for (int64_t j = 0; j < hd / 2; ++j) {
            const int64_t b = part * d + h * hd;
            std::memcpy(w + (b + 2 * j) * d, copy.data() + (b + j) * d, d * sizeof(float));
            std::memcpy(w + (b + 2 * j + 1) * d, copy.data() + (b + hd / 2 + j) * d, d * sizeof(float));
          }
    }
  } else if (fault == "final-softcap-dropped") {
    // The value's bytes follow the key (a u64 length, the name) and its type (u32 GGUF_TYPE_FLOAT32).
    const std::string key = arch + ".final_logit_softcapping";
    const uint64_t n = key.size();
    std::string pattern(reinterpret_cast<const char*>(&n), 8);
    pattern += key;
    const auto at = std::search(bytes.begin(), bytes.end(), pattern.begin(), pattern.end());
    if (at == bytes.end()) throw std::runtime_error("final-softcap-dropped: the model has no " + key);
    const float none = 1e30f;
    std::memcpy(&*(at + static_cast<std::ptrdiff_t>(pattern.size()) + 4), &none, 4);
  } else {  // kv-heads-interleaved
    const int64_t G = u32("attention.head_count_kv"), hd = u32("attention.key_length");
    for (int64_t l = 0; l < layers; ++l) {
      float* qw = tensor("blk." + std::to_string(l) + ".attn_q.weight");   // H hd rows of d
      float* ow = tensor("blk." + std::to_string(l) + ".attn_output.weight");  // d rows of H hd
      const std::vector<float> q0(qw, qw + H * hd * d), o0(ow, ow + d * H * hd);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t slot = (h % G) * (H / G) + h / G;  // in the group of KV head h % G
        std::memcpy(qw + slot * hd * d, q0.data() + h * hd * d, hd * d * sizeof(float));
        for (int64_t r = 0; r < d; ++r)
          std::memcpy(ow + r * H * hd + slot * hd, o0.data() + r * H * hd + h * hd, hd * sizeof(float));
      }
    }
  }
  gguf_free(g);
  std::ofstream out(dst, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + dst);
}

class Engine {
 public:
  explicit Engine(std::string fault) : fault_(std::move(fault)) {
    if (const std::string t = env("TINYGPT_LLAMA_TRACE"); !t.empty()) {
      trace_.open(t, std::ios::trunc);
      if (!trace_) throw std::runtime_error("cannot write the trace " + t);
    }
  }
  ~Engine() { unload(); }

  // The trace's line before request n's calls (n counts the requests after `load`, from 1).
  void trace_request(const std::string& op) {
    if (!trace_.is_open() || op == "hello" || op == "load") return;
    trace({{"request", ++traced_requests_}, {"op", op}});
  }

  json hello(const json& req) {
    json h = hello_fields();
    const int asked = req.value("protocol", 1);
    protocol_ = std::min(asked, 3);
    if (asked >= 2) {
      h["protocol"] = std::min(asked, 3);
      h["operations"] = {"ragged", "join", "fork", "truncate", "bench", "row-sampling"};
      if (asked >= 3) h["operations"] = {"ragged", "join", "fork", "truncate", "bench", "row-sampling", "extend", "save", "shift"};
      h["max_rows"] = kMaxRows;  // one llama sequence per row, and one more for its shadow
    }
    return h;
  }

  int protocol() const { return protocol_; }

  // What llama.cpp does differently on the model loaded (before one is, on the seed's gptneox): its
  // GELU (ggml_gelu, tanh from an fp16 table) is in the gptneox and gemma2 graphs, not in llama's or
  // qwen3's, which use SiLU.
  json deviations() const {
    json dev = json::array({"top-k-exact", "rope-angle-recurrence"});
    if (!kExactGelu && (arch_ == "gptneox" || arch_ == "gemma2")) dev.push_back("gelu-tanh");
    return dev;
  }

  json hello_fields() const {
    const json dev = deviations();
    std::string name = std::string("llama.cpp ") + kVersion + (kExactGelu ? " with exact GELU" : kBuild);
    if (!fault_.empty()) name += " (fault " + fault_ + ")";
    return {{"ok", true}, {"name", name}, {"formats", {"gguf"}}, {"deviations", dev}, {"kv_types", kv_type_names()},
            {"weight_types", {"f32", "q8_0", "q4_0", "q4_K_M"}}};
  }

  // The file `src` quantized to `type` by llama.cpp's own quantizer, at `dst`.
  static void quantize(const std::string& src, const std::string& dst, const std::string& type) {
    llama_model_quantize_params qp = llama_model_quantize_default_params();
    int64_t block = 32;
    if (type == "q8_0") qp.ftype = LLAMA_FTYPE_MOSTLY_Q8_0;
    else if (type == "q4_0") qp.ftype = LLAMA_FTYPE_MOSTLY_Q4_0;
    else if (type == "q4_K_M") qp.ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M, block = 256;  // k-quants: super-blocks of 256
    else throw std::runtime_error("unknown weight_type '" + type + "' (f32, q8_0, q4_0, q4_K_M)");
    // llama-quantize quantizes every 2-D tensor whose name ends in "weight"; a row length its type's
    // blocks do not divide it stores as a fallback type, saying so only in its log.
    ggml_context* meta = nullptr;
    gguf_init_params p{/*no_alloc=*/true, /*ctx=*/&meta};
    gguf_context* g = gguf_init_from_file(src.c_str(), p);
    if (!g) throw std::runtime_error("cannot read " + src);
    std::string refused;
    for (ggml_tensor* t = ggml_get_first_tensor(meta); t; t = ggml_get_next_tensor(meta, t)) {
      const std::string name = ggml_get_name(t);
      if (ggml_n_dims(t) < 2 || name.size() < 6 || name.compare(name.size() - 6, 6, "weight") != 0) continue;
      if (t->ne[0] % block != 0) {
        refused = name + " has rows of " + std::to_string(t->ne[0]) + " values, which " + type + "'s blocks of " + std::to_string(block) +
                  " cannot divide (llama-quantize would store it as another type)";
        break;
      }
    }
    gguf_free(g);
    ggml_free(meta);
    if (!refused.empty()) throw std::runtime_error("weight_type " + type + ": " + refused);
    qp.nthread = 1;
    if (llama_model_quantize(src.c_str(), dst.c_str(), &qp) != 0) throw std::runtime_error("llama_model_quantize to " + type + " failed on " + src);
  }

  // The KV cache types `load` takes ("kv_type"): one type for K and V, or "K/V" apart.
  static json kv_type_names() { return {"f32", "f16", "q8_0", "q4_0", "K/V of these (e.g. q8_0/f16)"}; }
  static ggml_type kv_type(const std::string& n) {
    if (n == "f32") return GGML_TYPE_F32;
    if (n == "f16") return GGML_TYPE_F16;
    if (n == "q8_0") return GGML_TYPE_Q8_0;
    if (n == "q4_0") return GGML_TYPE_Q4_0;
    throw std::runtime_error("unknown kv_type '" + n + "' (f32, f16, q8_0, q4_0, or K/V of these)");
  }

  void load(const json& req) {
    if (req.value("format", "") != "gguf") throw std::runtime_error("this adapter loads format gguf only");
    unload();
    const json cfg = req.value("config", json::object());
    context_ = cfg.value("context", 256);
    std::string path = req.at("checkpoint").get<std::string>();
    if (fault_ == "rope-permutation-skipped" || fault_ == "kv-heads-interleaved" || fault_ == "final-softcap-dropped") {
      const std::string patched = path + "." + fault_ + ".gguf";
      plant_export_fault(path, patched, fault_);
      path = patched;
    }
    if (const std::string w = req.value("weight_type", std::string()); !w.empty() && w != "f32") {
      const std::string quantized = path + "." + w + ".gguf";
      quantize(path, quantized, w);
      path = quantized;
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    model_ = llama_model_load_from_file(path.c_str(), mp);
    if (!model_) throw std::runtime_error("llama_model_load_from_file failed on " + path);
    char arch[64] = {0};
    llama_model_meta_val_str(model_, "general.architecture", arch, sizeof arch);
    arch_ = arch;
    llama_context_params cp = llama_context_default_params();
    cp.n_seq_max = 2 * kMaxRows + kPool + 1;  // every row, its shadow, the released rows kept, a scratch one
    cp.kv_unified = true;         // seq_cp and seq_rm re-tag cells; nothing is copied
    // A sliding-window model's cache (gemma2) keeps every cell, the mask doing the window: a rollback,
    // a shift or a reused prefix may need entries a window-sized cache would have given up.
    cp.swa_full = true;
    cp.n_ctx = static_cast<uint32_t>((kMaxRows + kPool) * (context_ + kRollback + 64));
    cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(kMaxRows * context_);
    if (const std::string u = env("TINYGPT_LLAMA_UBATCH"); !u.empty()) cp.n_ubatch = static_cast<uint32_t>(std::stoi(u));
    cp.n_threads = cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = fault_ == "f16-cache" ? GGML_TYPE_F16 : GGML_TYPE_F32;
    // "kv_type": the cache's K and V types. llama.cpp needs flash attention for a quantized V (its
    // plain attention multiplies V as a matrix it cannot read quantized); it is turned on only then,
    // since it changes the arithmetic of every row.
    const std::string kv = req.value("kv_type", std::string());
    if (!kv.empty()) {
      const auto slash = kv.find('/');
      cp.type_k = kv_type(kv.substr(0, slash));
      cp.type_v = kv_type(slash == std::string::npos ? kv : kv.substr(slash + 1));
      if (cp.type_v != GGML_TYPE_F32 && cp.type_v != GGML_TYPE_F16) cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    }
    cp.no_perf = true;
    trace({{"call", "context"}, {"n_ctx", cp.n_ctx}, {"n_batch", cp.n_batch}, {"n_ubatch", cp.n_ubatch}, {"n_seq_max", cp.n_seq_max},
           {"kv_unified", cp.kv_unified}, {"swa_full", cp.swa_full}, {"type_k", ggml_type_name(cp.type_k)},
           {"type_v", ggml_type_name(cp.type_v)}, {"flash_attn", cp.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_ENABLED}});
    ctx_ = llama_init_from_model(model_, cp);
    if (!ctx_) throw std::runtime_error("llama_init_from_model failed" + (kv.empty() ? std::string() : " with kv_type " + kv));
    n_vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model_));
    if (n_vocab_ <= 0) n_vocab_ = cfg.value("vocab_size", 4096);
    reset(true);
  }

  void reset(bool really = false) {
    if (!ctx_) throw std::runtime_error("no model loaded");
    if (fault_ == "no-reset" && !really) return;
    clear();
    pos_.assign(kMaxRows, 0);
    prompt_.assign(kMaxRows, 0);
    live_.assign(kMaxRows, false);
    fed_.assign(kMaxRows, {});
    pool_.clear();
  }

  // New rows (a prefill: each at positions 0..T-1, rows of any lengths): their logits and their ids.
  // A prompt sharing a prefix with a released row in the pool takes that row's cells for it.
  json prefill(const json& ids, json& rows_out, json& reused) {
    std::vector<int> rows;
    for (size_t b = 0; b < ids.size(); ++b) {
      int s = 0;
      while (s < kMaxRows && (live_[s] || std::find(rows.begin(), rows.end(), s) != rows.end())) ++s;
      if (s == kMaxRows) throw std::runtime_error("more than " + std::to_string(kMaxRows) + " rows");
      rows.push_back(s);
    }
    json rest = json::array();
    reused = json::array();
    for (size_t b = 0; b < ids.size(); ++b) {
      const int row = rows[b];
      const std::vector<int> prompt = ids[b].get<std::vector<int>>();
      if (prompt.empty()) throw std::runtime_error("an empty row");
      pos_[row] = 0;  // positions from 0: on a sequence `reset` did not clear, llama_decode refuses them
      prompt_[row] = static_cast<int>(prompt.size());
      live_[row] = true;
      fed_[row].clear();
      int keep = 0;
      if (protocol_ >= 3 && static_cast<int>(prompt.size()) <= context_) {
        size_t best = pool_.size();
        int shared = 0;
        for (size_t i = 0; i < pool_.size(); ++i) {
          const auto& t = pool_[i].tokens;
          int n = 0;
          while (n < static_cast<int>(std::min(t.size(), prompt.size())) && t[n] == prompt[n]) ++n;
          if (n > shared) best = i, shared = n;
        }
        keep = std::min(shared, static_cast<int>(prompt.size()) - 1);  // the last token is computed: its logits are the answer
        if (fault_ == "reused-prefix-too-long" && shared == static_cast<int>(prompt.size())) keep = shared;  // planted: all kept
        if (keep > 0) {
          seq_cp(pool_[best].seq, row, 0, keep);
          seq_rm(pool_[best].seq, -1, -1);
          pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(best));  // the slot is taken, as llama-server's is
          pos_[row] = keep;
          fed_[row].assign(prompt.begin(), prompt.begin() + keep);
        } else {
          keep = 0;
        }
      }
      reused.push_back(keep);
      // The planted fault keeps every cell and feeds the last token again after them, one position on.
      rest.push_back(keep == static_cast<int>(prompt.size()) ? std::vector<int>{prompt.back()}
                                                             : std::vector<int>(prompt.begin() + keep, prompt.end()));
    }
    rows_out = rows;
    return decode(rows, rest);
  }

  // One id per row for `rows` (all live rows in order when none are named).
  json step(const json& ids, const json* named) {
    std::vector<int> rows;
    if (named) {
      for (const auto& r : *named) rows.push_back(checked_row(r.get<int>()));
    } else {
      for (int s = 0; s < kMaxRows; ++s)
        if (live_[s]) rows.push_back(s);
    }
    if (rows.size() != ids.size()) throw std::runtime_error(std::to_string(ids.size()) + " rows of ids for " + std::to_string(rows.size()) + " rows");
    for (const auto& r : ids)
      if (r.size() != 1) throw std::runtime_error("a step takes one id per row");
    return decode(rows, ids);
  }

  // A row not in the batch, its sequence and its shadow emptied: where a fork or a restore lands.
  int free_row() {
    int d = 0;
    while (d < kMaxRows && live_[d]) ++d;
    if (d == kMaxRows) throw std::runtime_error("more than " + std::to_string(kMaxRows) + " rows");
    seq_rm(d, -1, -1);
    seq_rm(kMaxRows + d, -1, -1);
    return d;
  }

  int fork(int row) {
    checked_row(row);
    const int d = free_row();
    seq_cp(row, d, -1, -1);
    seq_cp(kMaxRows + row, kMaxRows + d, -1, -1);
    pos_[d] = pos_[row];
    prompt_[d] = prompt_[row];
    live_[d] = true;
    fed_[d] = fed_[row];
    return d;
  }

  // Drops the newest n tokens of `row`; the cells they had pushed out of the window come back from
  // its shadow.
  void truncate(int row, int n) {
    checked_row(row);
    if (n < 0 || n > pos_[row]) throw std::runtime_error("cannot drop " + std::to_string(n) + " tokens");
    pos_[row] -= n;
    fed_[row].resize(std::min(fed_[row].size(), static_cast<size_t>(pos_[row])));
    seq_rm(row, pos_[row], -1);
    if (fault_ == "rollback-forgets-the-window") return;  // planted: the evicted entries stay gone
    const int lo = std::max(0, pos_[row] - context_);
    seq_cp(kMaxRows + row, row, lo, pos_[row]);
    seq_rm(kMaxRows + row, lo, -1);
  }

  // Several tokens appended to `row` in one llama_decode (micro-batched by n_ubatch): the last one's logits.
  json extend(int row, const json& ids) {
    checked_row(row);
    if (ids.empty()) throw std::runtime_error("extend takes at least one id");
    if (pos_[row] + static_cast<int>(ids.size()) > context_) throw std::runtime_error("a chunk must end inside the window");
    json out = decode({row}, json::array({ids}));
    if (fault_ == "extend-last-token-dropped") {  // planted: the chunk's last cell never stays in the cache
      seq_rm(row, pos_[row] - 1, -1);
      --pos_[row];
      fed_[row].pop_back();
    }
    return out;
  }

  // Sequence `seq`'s cells as llama_state_seq_get_data gives them, and those bytes put into `seq`.
  std::string seq_state(int seq) {
    const size_t n = llama_state_seq_get_size(ctx_, seq);
    std::string raw(n, '\0');
    if (llama_state_seq_get_data(ctx_, reinterpret_cast<uint8_t*>(raw.data()), n, seq) != n)
      throw std::runtime_error("llama_state_seq_get_data wrote another size than it said");
    if (trace_.is_open()) {  // a state put back later is named by its bytes (equal bytes: either buffer)
      state_buffers_[raw] = next_buffer_;
      trace({{"call", "state_get"}, {"seq", seq}, {"buffer", next_buffer_++}});
    }
    return raw;
  }
  void put_seq_state(const char* data, size_t n, int seq) {
    if (trace_.is_open()) {
      const auto b = state_buffers_.find(std::string(data, n));
      if (b == state_buffers_.end()) throw std::runtime_error("the trace cannot name a state this process did not save");
      trace({{"call", "state_set"}, {"seq", seq}, {"buffer", b->second}});
    }
    if (llama_state_seq_set_data(ctx_, reinterpret_cast<const uint8_t*>(data), n, seq) == 0)
      throw std::runtime_error("llama_state_seq_set_data refused the state");
  }

  // The row's cells (llama_state_seq_get_data) and its shadow's (the evicted cells a rollback past the
  // window brings back: a state without them is right until the restored row rolls back), with its
  // position and prompt length, as base64.
  std::string save(int row) {
    checked_row(row);
    int from = row;
    if (fault_ == "state-saved-in-part") {  // planted: the row's oldest 16 cells are left out of its state
        seq_rm(kScratch, -1, -1);
      seq_cp(row, kScratch, -1, -1);
      seq_rm(kScratch, 0, std::max(0, pos_[row] - context_) + 16);
      from = kScratch;
    }
    const std::string cells = seq_state(from);
    const std::string shadow = fault_ == "state-saved-without-history" ? std::string() : seq_state(kMaxRows + row);
    const int32_t head[4] = {pos_[row], prompt_[row], static_cast<int32_t>(cells.size()), 0};
    const std::string raw = std::string(reinterpret_cast<const char*>(head), sizeof head) + cells + shadow;
    if (from == kScratch) seq_rm(kScratch, -1, -1);
    return base64(raw);
  }

  int restore(const std::string& state) {
    const std::string raw = unbase64(state);
    if (raw.size() <= 16) throw std::runtime_error("not a state this adapter saved");
    int32_t head[4];
    std::memcpy(head, raw.data(), sizeof head);
    const size_t cells = static_cast<size_t>(head[2]);
    if (head[2] <= 0 || cells > raw.size() - 16) throw std::runtime_error("not a state this adapter saved");
    const int d = free_row();
    put_seq_state(raw.data() + 16, cells, d);
    if (raw.size() > 16 + cells) put_seq_state(raw.data() + 16 + cells, raw.size() - 16 - cells, kMaxRows + d);  // its shadow
    pos_[d] = head[0];
    prompt_[d] = head[1];
    live_[d] = true;
    fed_[d].assign(static_cast<size_t>(head[0]), -1);  // its ids are not in the state: never a later prompt's prefix
    return d;
  }

  // llama.cpp's context shift: the `discard` cells after the first `keep` go, the later ones move
  // down by `discard` (their keys re-rotated by llama.cpp's K-shift at the next decode).
  void shift(int row, int keep, int discard) {
    checked_row(row);
    if (keep < 0 || discard < 1 || keep + discard > pos_[row])
      throw std::runtime_error("cannot drop " + std::to_string(discard) + " after the first " + std::to_string(keep));
    if (pos_[row] > context_) throw std::runtime_error("a shift needs every cell of the row (inside the window)");
    if (!llama_memory_can_shift(llama_get_memory(ctx_))) throw std::runtime_error("this llama.cpp memory cannot shift positions");
    // A cell of a unified cache may belong to several sequences (seq_cp shares it: a fork, a reused
    // prefix, the prompt pool), and llama_memory_seq_add moves the cell - its position and, at the
    // K-shift, its key - for every one of them: a shifted fork would shift its parent. Measured on
    // llama.cpp 0.4.0: the parent's next llama_decode is refused ("the sequence positions must remain
    // consecutive"), or where its positions line up it decodes against keys moved under it (churn:
    // 0.29). So the row's cells are made its own first: its state copied out, its cells let go, the
    // state put back into fresh cells (llama_state_seq_*; the other sequences keep the old ones).
    if (fault_ != "shift-shares-cells") {  // planted: the shared cells move for every sequence
      const std::string own = seq_state(row);
      seq_rm(row, -1, -1);
      put_seq_state(own.data(), own.size(), row);
    }
    seq_rm(row, keep, keep + discard);
    seq_rm(kMaxRows + row, -1, -1);  // nothing before the shift comes back
    if (fault_ == "shift-not-renumbered") return;      // planted: the later cells keep their positions
    seq_add(row, keep + discard, -1, -discard);
    pos_[row] -= discard;
    prompt_[row] = std::min(prompt_[row], keep);
    auto& f = fed_[row];  // the kept later cells were computed beside the dropped tokens: not a cold run's
    f.erase(f.begin() + std::min<size_t>(keep, f.size()), f.begin() + std::min<size_t>(keep + discard, f.size()));
    for (size_t i = static_cast<size_t>(keep); i < f.size(); ++i) f[i] = -1;
  }

  void release(int row) {
    checked_row(row);
    if (protocol_ >= 3 && pos_[row] > 0 && pos_[row] <= context_) {  // kept for a later prompt that shares its prefix
      int seq = 2 * kMaxRows;
      if (static_cast<int>(pool_.size()) == kPool) {  // the oldest gives up its sequence
        seq = pool_.front().seq;
        seq_rm(seq, -1, -1);
        pool_.erase(pool_.begin());
      } else {
        while (std::any_of(pool_.begin(), pool_.end(), [&](const Released& r) { return r.seq == seq; })) ++seq;
      }
      seq_cp(row, seq, -1, -1);
      pool_.push_back({seq, fed_[row]});
    }
    seq_rm(row, -1, -1);
    seq_rm(kMaxRows + row, -1, -1);
    live_[row] = false;
  }

  // `bench`: llama.cpp's own greedy loop, timed here so the protocol's JSON is not: the prompts
  // (one sequence each) prefilled in one llama_decode, then n steps of one token per row, each
  // row's argmax read straight from llama_get_logits_ith. Inside the window (no trimming).
  json bench(const json& req) {
    if (!ctx_) throw std::runtime_error("no model loaded");
    const json& ids = req.at("ids");
    const int n = req.at("n").get<int>(), threads = req.value("threads", 1);
    const int B = static_cast<int>(ids.size());
    if (B < 1 || B > kMaxRows) throw std::runtime_error("bench takes 1 to " + std::to_string(kMaxRows) + " rows");
    if (n < 1 || threads < 1) throw std::runtime_error("bench needs n >= 1 and threads >= 1");
    int total = 0;
    for (const auto& r : ids) {
      if (r.empty() || static_cast<int>(r.size()) + n > context_)
        throw std::runtime_error("bench stays inside the window: each prompt 1 to context - n ids");
      total += static_cast<int>(r.size());
    }
    // A context of its own, as an application decoding B independent sequences sets one up: a cache
    // per sequence (not unified) of `context` cells each. (The checks' context keeps 2 x 16 sequences
    // in one unified cache for fork and rollback, where every query would scan every row's cells.)
    llama_context_params cp = llama_context_default_params();
    cp.n_seq_max = static_cast<uint32_t>(B);
    cp.kv_unified = false;
    cp.n_ctx = static_cast<uint32_t>(B * context_);
    cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(std::max(total, B));
    cp.n_threads = cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.no_perf = true;
    llama_context* ctx = llama_init_from_model(model_, cp);
    if (!ctx) throw std::runtime_error("llama_init_from_model failed for the bench");
    const std::unique_ptr<llama_context, void (*)(llama_context*)> own_ctx(ctx, llama_free);
    using clock = std::chrono::steady_clock;
    std::vector<int> pos(B, 0), last(B);
    std::vector<std::vector<int>> out(B);
    llama_batch batch = llama_batch_init(std::max(total, B), 0, 1);
    int k = 0;
    for (int b = 0; b < B; ++b) {
      for (size_t i = 0; i < ids[b].size(); ++i, ++k) {
        batch.token[k] = ids[b][i].get<int>();
        batch.pos[k] = pos[b]++;
        batch.n_seq_id[k] = 1;
        batch.seq_id[k][0] = b;
        batch.logits[k] = i + 1 == ids[b].size();
      }
      last[b] = k - 1;
    }
    batch.n_tokens = total;
    auto argmax = [&](int i) {
      const float* l = llama_get_logits_ith(ctx, i);
      if (!l) throw std::runtime_error("no logits");
      return static_cast<int>(std::max_element(l, l + n_vocab_) - l);
    };
    const auto t0 = clock::now();
    int rc = llama_decode(ctx, batch);
    const auto t1 = clock::now();
    for (int step = 0; rc == 0 && step < n; ++step) {
      for (int b = 0; b < B; ++b) {
        const int id = argmax(last[b]);
        out[b].push_back(id);
        batch.token[b] = id;
        batch.pos[b] = pos[b]++;
        batch.n_seq_id[b] = 1;
        batch.seq_id[b][0] = b;
        batch.logits[b] = true;
        last[b] = b;
      }
      batch.n_tokens = B;
      rc = llama_decode(ctx, batch);
    }
    const auto t2 = clock::now();
    for (int b = 0; rc == 0 && b < B; ++b) out[b].push_back(argmax(last[b]));
    llama_batch_free(batch);
    if (rc != 0) throw std::runtime_error("llama_decode returned " + std::to_string(rc));
    return {{"ok", true}, {"prefill_s", std::chrono::duration<double>(t1 - t0).count()},
            {"decode_s", std::chrono::duration<double>(t2 - t1).count()}, {"ids", out}};
  }

  // `sample`. Without "rows": one chain (temperature, top-k, top-p, dist) seeded once with the request's
  // seed and shared by the rows, as the protocol says. With "rows" (row-sampling): a chain per row with
  // its own settings and seed, as llama-server keeps one per slot (no seed: LLAMA_DEFAULT_SEED, random).
  json sample(const json& req) const {
    const auto& rows = req.at("logits");
    const auto& hist = req.value("history", json::array());
    const int n = req.at("n").get<int>();
    const bool per_row = req.contains("rows");
    if (per_row && req.at("rows").size() != rows.size()) throw std::runtime_error("one \"rows\" entry per row of logits");
    llama_sampler* shared = per_row ? nullptr : chain_for(req, static_cast<uint32_t>(req.at("seed").get<int64_t>()));
    json out = json::array();
    for (size_t b = 0; b < rows.size(); ++b) {
      const json& settings = per_row ? req.at("rows")[b] : req;
      llama_sampler* chain = shared;
      // planted first-seed-for-every-row: each row's chain seeded with the batch's first row's seed
      const json& seeded = per_row && fault_ == "first-seed-for-every-row" ? req.at("rows")[0] : settings;
      if (per_row)
        chain = chain_for(settings, seeded.contains("seed") ? static_cast<uint32_t>(seeded.at("seed").get<int64_t>()) : LLAMA_DEFAULT_SEED);
      try {
        out.push_back(draw_row(rows[b], b < hist.size() ? hist[b].get<std::vector<int>>() : std::vector<int>{},
                               settings.at("penalty").get<double>(), chain, n));
      } catch (...) {
        llama_sampler_free(chain);
        throw;
      }
      if (per_row) llama_sampler_free(chain);
    }
    if (shared) llama_sampler_free(shared);
    return out;
  }

 private:
  // Temperature, top-k, top-p and the draw as one chain seeded with `seed` (greedy at temperature 0).
  static llama_sampler* chain_for(const json& s, uint32_t seed) {
    const double t = s.at("temperature").get<double>(), p = s.at("top_p").get<double>();
    const int top_k = s.at("top_k").get<int>();
    llama_sampler* chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (t == 0) {
      llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    } else {
      llama_sampler_chain_add(chain, llama_sampler_init_temp(static_cast<float>(t)));
      if (top_k > 0) llama_sampler_chain_add(chain, llama_sampler_init_top_k(top_k));
      if (p < 1) llama_sampler_chain_add(chain, llama_sampler_init_top_p(static_cast<float>(p), 1));
      llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
    }
    return chain;
  }

  // n draws of one row through `chain`, after llama.cpp's penalties sampler over the row's history.
  static json draw_row(const json& row, const std::vector<int>& h, double r, llama_sampler* chain, int n) {
    const int V = static_cast<int>(row.size());
    std::vector<llama_token_data> base(V);
    for (int v = 0; v < V; ++v) {
      const auto& x = row[v];
      base[v] = {v, x.is_string() ? -INFINITY : x.get<float>(), 0.0f};
    }
    if (r != 1.0 && !h.empty()) {  // the penalty, applied once
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
      if (arr.selected < 0 || static_cast<size_t>(arr.selected) >= arr.size) throw std::runtime_error("the sampler chain selected nothing");
      ids.push_back(arr.data[arr.selected].id);
    }
    return ids;
  }

  int checked_row(int row) const {
    if (row < 0 || row >= kMaxRows || !live_[row]) throw std::runtime_error("row " + std::to_string(row) + " is not live");
    return row;
  }

  json decode(const std::vector<int>& rows, const json& ids) {
    if (!ctx_) throw std::runtime_error("no model loaded");
    int total = 0;
    for (const auto& r : ids) total += static_cast<int>(r.size());
    if (ids.empty() || total == 0) throw std::runtime_error("no ids");
    llama_batch batch = llama_batch_init(total, 0, 1);
    std::vector<int> last(rows.size());
    int k = 0;
    for (size_t b = 0; b < rows.size(); ++b) {
      const auto& r = ids[b];
      for (size_t i = 0; i < r.size(); ++i, ++k) {
        batch.token[k] = r[i].get<int>();
        fed_[rows[b]].push_back(batch.token[k]);
        batch.pos[k] = pos_[rows[b]]++;
        batch.n_seq_id[k] = 1;
        batch.seq_id[k][0] = rows[b];
        batch.logits[k] = i + 1 == r.size();
      }
      last[b] = k - 1;
    }
    batch.n_tokens = total;
    if (trace_.is_open()) {  // a segment per row: its tokens at consecutive positions, logits of the last
      json segments = json::array();
      for (size_t b = 0, at = 0; b < rows.size(); at += ids[b].size(), ++b)
        segments.push_back({{"seq", rows[b]}, {"pos", batch.pos[at]}, {"tokens", ids[b]}});
      trace({{"call", "decode"}, {"segments", segments}});
    }
    const int rc = llama_decode(ctx_, batch);
    llama_batch_free(batch);
    if (rc != 0) throw std::runtime_error("llama_decode returned " + std::to_string(rc));
    json out = json::array();
    for (size_t b = 0; b < rows.size(); ++b) {
      trace({{"call", "logits"}, {"i", last[b]}, {"answer_row", b}});
      const float* l = llama_get_logits_ith(ctx_, last[b]);
      if (!l) throw std::runtime_error("no logits for row " + std::to_string(rows[b]));
      out.push_back(std::vector<float>(l, l + n_vocab_));
    }
    for (int r : rows) trim(r);
    return out;
  }

  // SPEC 4's window on row b: its last `context` positions stay in the row; older ones move to its
  // shadow (for a rollback), which keeps the newest kRollback of them.
  void trim(int b) {
    if (fault_ == "never-trimmed") return;
    const int keep = fault_ == "one-entry-too-few" ? context_ - 1 : context_;
    if (pos_[b] <= keep) return;
    if (fault_ == "context-shift-keeps-prompt") {  // the prompt stays; the oldest tokens after it go
      seq_rm(b, prompt_[b], pos_[b] - keep + prompt_[b]);
      return;
    }
    const int shadow = kMaxRows + b, cut = pos_[b] - keep;
    seq_cp(b, shadow, 0, cut);
    seq_rm(b, 0, cut);
    if (cut > kRollback) seq_rm(shadow, 0, cut - kRollback);
  }

  // llama.cpp's memory calls, traced.
  void clear() {
    trace({{"call", "memory_clear"}});
    llama_memory_clear(llama_get_memory(ctx_), true);
  }
  void seq_rm(int seq, int p0, int p1) {
    trace({{"call", "seq_rm"}, {"seq", seq}, {"p0", p0}, {"p1", p1}});
    llama_memory_seq_rm(llama_get_memory(ctx_), seq, p0, p1);
  }
  void seq_cp(int src, int dst, int p0, int p1) {
    trace({{"call", "seq_cp"}, {"src", src}, {"dst", dst}, {"p0", p0}, {"p1", p1}});
    llama_memory_seq_cp(llama_get_memory(ctx_), src, dst, p0, p1);
  }
  void seq_add(int seq, int p0, int p1, int delta) {
    trace({{"call", "seq_add"}, {"seq", seq}, {"p0", p0}, {"p1", p1}, {"delta", delta}});
    llama_memory_seq_add(llama_get_memory(ctx_), seq, p0, p1, delta);
  }
  void trace(const json& line) {
    if (trace_.is_open()) trace_ << line.dump() << "\n" << std::flush;
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
  std::vector<bool> live_;          // per row: in the batch
  std::vector<std::vector<int>> fed_;  // per row: the ids fed (-1 where a cell is not a cold run's)
  struct Released {
    int seq;
    std::vector<int> tokens;
  };
  std::vector<Released> pool_;  // released rows kept for prefix reuse, oldest first
  int protocol_ = 2;            // what hello agreed on
  std::string arch_ = "gptneox";  // the loaded model's llama.cpp architecture
  std::ofstream trace_;           // TINYGPT_LLAMA_TRACE's file, when set
  int traced_requests_ = 0;
  std::map<std::string, int> state_buffers_;  // a traced state's bytes -> its buffer in the trace
  int next_buffer_ = 0;
};

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const uint32_t n = (uint32_t(uint8_t(in[i])) << 16) | (i + 1 < in.size() ? uint32_t(uint8_t(in[i + 1])) << 8 : 0) |
                       (i + 2 < in.size() ? uint32_t(uint8_t(in[i + 2])) : 0);
    out += kB64[(n >> 18) & 63];
    out += kB64[(n >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(n >> 6) & 63] : '=';
    out += i + 2 < in.size() ? kB64[n & 63] : '=';
  }
  return out;
}

std::string unbase64(const std::string& in) {
  if (in.size() % 4) throw std::runtime_error("a state is base64 (a multiple of 4 characters)");
  std::string out;
  uint32_t n = 0;
  int bits = 0;
  for (char ch : in) {
    if (ch == '=') break;
    const char* at = std::strchr(kB64, ch);
    if (!at || !ch) throw std::runtime_error("a state is base64");
    n = (n << 6) | static_cast<uint32_t>(at - kB64);
    bits += 6;
    if (bits >= 8) bits -= 8, out += static_cast<char>((n >> bits) & 0xFF);
  }
  return out;
}

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string fault = env("TINYGPT_ENGINE_FAULT");
  if (!kFaults.count(fault)) {
    std::fprintf(stderr, "llama.cpp adapter: unknown TINYGPT_ENGINE_FAULT %s\n", fault.c_str());
    return 2;
  }
  llama_log_set(quiet, nullptr);
  ggml_backend_load_all_from_path(lib_dir().c_str());
  llama_backend_init();
  // `adapter --quantize IN OUT TYPE`: llama-quantize's arguments, through the same quantizer `load` uses
  // (tinygpt export --quantize runs it).
  if (argc > 1 && std::string(argv[1]) == "--quantize") {
    if (argc != 5) {
      std::fprintf(stderr, "usage: adapter --quantize IN.gguf OUT.gguf q8_0|q4_0|q4_K_M\n");
      return 2;
    }
    try {
      Engine::quantize(argv[2], argv[3], argv[4]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
    return 0;
  }
  std::unique_ptr<Engine> own;
  try {
    own = std::make_unique<Engine>(fault);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama.cpp adapter: %s\n", e.what());
    return 2;
  }
  Engine& engine = *own;
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    json answer;
    try {
      const json req = json::parse(line);
      const std::string op = req.value("op", "");
      if (op == "quit") break;
      engine.trace_request(op);
      if (op == "hello") answer = engine.hello(req);
      else if (op == "load") engine.load(req), answer = {{"ok", true}, {"deviations", engine.deviations()}};
      else if (op == "reset") engine.reset(), answer = {{"ok", true}};
      else if (op == "prefill") {
        json rows, reused;
        json logits = engine.prefill(req.at("ids"), rows, reused);
        answer = {{"ok", true}, {"logits", logits}, {"rows", rows}};
        if (engine.protocol() >= 3) answer["reused"] = reused;
      } else if (op == "step") answer = {{"ok", true}, {"logits", engine.step(req.at("ids"), req.contains("rows") ? &req["rows"] : nullptr)}};
      else if (op == "fork") answer = {{"ok", true}, {"row", engine.fork(req.at("row").get<int>())}};
      else if (op == "truncate") engine.truncate(req.at("row").get<int>(), req.at("n").get<int>()), answer = {{"ok", true}};
      else if (op == "release") engine.release(req.at("row").get<int>()), answer = {{"ok", true}};
      else if (op == "extend") answer = {{"ok", true}, {"logits", engine.extend(req.at("row").get<int>(), req.at("ids"))}};
      else if (op == "save") answer = {{"ok", true}, {"state", engine.save(req.at("row").get<int>())}};
      else if (op == "restore") answer = {{"ok", true}, {"row", engine.restore(req.at("state").get<std::string>())}};
      else if (op == "shift")
        engine.shift(req.at("row").get<int>(), req.at("keep").get<int>(), req.at("discard").get<int>()), answer = {{"ok", true}};
      else if (op == "bench") answer = engine.bench(req);
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
