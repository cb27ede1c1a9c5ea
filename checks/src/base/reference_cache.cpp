// The on-disk cache of references (reference.h: cached_reference). A reference is our model's
// uncached greedy run and its full and banded forwards: a function of the weights, the prompt, the
// number of tokens and the code that computed them. The key holds all four - the weights' bytes and
// the config hashed, the prompt's ids, the tokens, and the running program's ELF build id (any change
// to the code links another program) - so an entry is only ever read by the computation that wrote it.
#include <cstdio>
#include <link.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tinygpt/checks/reference.h"
#include "tinygpt/atomic_file.h"
#include "tinygpt/safetensors.h"

namespace tinygpt::checks {

namespace {

// The program's GNU build id as hex; "" when it was linked without one (then nothing is cached).
std::string program_build_id() {
  static const std::string id = [] {
    std::string out;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* data) -> int {
          auto& hex = *static_cast<std::string*>(data);
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_NOTE) continue;
            const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
            const char* end = p + ph.p_memsz;
            while (p + sizeof(ElfW(Nhdr)) <= end) {
              const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p);
              const char* name = p + sizeof(ElfW(Nhdr));
              const auto* desc = reinterpret_cast<const unsigned char*>(name + ((n->n_namesz + 3) & ~3u));
              if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
                static const char digits[] = "0123456789abcdef";
                for (unsigned k = 0; k < n->n_descsz; ++k) hex += digits[desc[k] >> 4], hex += digits[desc[k] & 15];
                return 1;
              }
              p = reinterpret_cast<const char*>(desc) + ((n->n_descsz + 3) & ~3u);
            }
          }
          return 1;  // the first object listed is the program itself: stop there
        },
        &out);
    return out;
  }();
  return id;
}

// Two 64-bit FNV-1a streams over the same bytes (different offsets): a 128-bit content key.
struct Hasher {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {  // a word at a time: the weights are megabytes
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      a = (a ^ w) * 0x100000001b3ull;
      b = (b ^ (w + 0x9e3779b97f4a7c15ull)) * 0x100000001b3ull;
      b ^= b >> 29;
    }
    for (; i < n; ++i) a = (a ^ p[i]) * 0x100000001b3ull, b = (b ^ p[i]) * 0x100000001b3ull;
  }
  void text(const std::string& s) { bytes(s.data(), s.size() + 1); }
  void tensor(const at::Tensor& t) {
    const at::Tensor c = t.to(at::kCPU).contiguous();
    text(std::string(c.dtype().name()));
    for (int64_t d : c.sizes()) bytes(&d, sizeof d);
    bytes(c.data_ptr(), c.nbytes());
  }
  std::string hex() const {
    char s[33];
    std::snprintf(s, sizeof s, "%016llx%016llx", static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
    return s;
  }
};

// The program, the config and the weights hashed into `h`; false when nothing is kept here.
bool keyed(GPT& model, Hasher& h) {
  const char* dir = std::getenv("TINYGPT_REFERENCE_CACHE");
  if (!dir || !*dir) return false;
  const std::string build = program_build_id();
  if (build.empty()) return false;
  h.text(build);
  h.text(model->config().to_string());
  for (const auto& [name, t] : model->state_dict()) {
    if (!t.device().is_cpu()) return false;
    h.text(name);
    h.tensor(t);
  }
  return true;
}

std::string in_cache(const std::string& name) {
  return (std::filesystem::path(std::getenv("TINYGPT_REFERENCE_CACHE")) / name).string();
}

// The entry's path for (model, prompt, tokens), or "" when nothing is cached here.
std::string entry_path(GPT& model, const at::Tensor& prompt, int64_t tokens) {
  Hasher h;
  if (!prompt.device().is_cpu() || !keyed(model, h)) return "";
  h.tensor(prompt);
  h.bytes(&tokens, sizeof tokens);
  return in_cache("reference-" + h.hex() + ".safetensors");
}

}  // namespace

std::string cache_entry_path(GPT& model, const std::string& kind, const std::string& key, const std::string& extension) {
  Hasher h;
  if (!keyed(model, h)) return "";
  h.text(kind);
  h.text(key);
  return in_cache(kind + "-" + h.hex() + extension);
}

void kept_json(GPT& model, const std::string& kind, const std::string& key, const std::function<nlohmann::json()>& compute,
               const std::function<void(const nlohmann::json&)>& use) {
  const std::string path = cache_entry_path(model, kind, key, ".json");
  std::error_code ec;
  if (!path.empty() && std::filesystem::exists(path, ec)) {
    try {
      use(nlohmann::json::parse(std::ifstream(path)));
      return;
    } catch (const std::exception&) {  // unreadable or of another shape: computed again
    }
  }
  const nlohmann::json doc = compute();
  if (!path.empty()) {
    try {
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      write_text_atomically(path, doc.dump());
    } catch (const std::exception&) {  // a cache that cannot be written only costs the next run time
    }
  }
  use(doc);
}

std::optional<Reference> load_cached_reference(GPT& model, const at::Tensor& prompt, int64_t tokens) {
  const std::string path = entry_path(model, prompt, tokens);
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    const TensorFile f = read_safetensors(path);
    std::map<std::string, at::Tensor> t(f.tensors.begin(), f.tensors.end());
    Reference r;
    r.uncached = t.at("uncached");
    r.uncached_logits = t.at("uncached_logits");
    r.uncached_margin = t.at("uncached_margin");
    r.steps.full = t.at("full");
    r.steps.band = t.at("band");
    if (r.uncached.size(1) != prompt.size(1) + tokens || r.uncached_logits.size(1) != tokens) return std::nullopt;
    return r;
  } catch (const std::exception&) {  // unreadable (another version's, cut short): computed again
    return std::nullopt;
  }
}

void store_cached_reference(GPT& model, const at::Tensor& prompt, int64_t tokens, const Reference& r) {
  const std::string path = entry_path(model, prompt, tokens);
  if (path.empty()) return;
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_safetensors(path,
                      {{"uncached", r.uncached.cpu()},
                       {"uncached_logits", r.uncached_logits.cpu()},
                       {"uncached_margin", r.uncached_margin.cpu()},
                       {"full", r.steps.full.cpu()},
                       {"band", r.steps.band.cpu()}},
                      {{"what", "tinygpt reference: uncached greedy run, full and banded forwards"},
                       {"tokens", std::to_string(tokens)},
                       {"build_id", program_build_id()}});
  } catch (const std::exception&) {  // a cache that cannot be written only costs the next run time
  }
}

Reference cached_reference(GPT& model, const at::Tensor& prompt, int64_t tokens) {
  if (auto hit = load_cached_reference(model, prompt, tokens)) return std::move(*hit);
  Reference r = build_reference(model, prompt, tokens);
  store_cached_reference(model, prompt, tokens, r);
  return r;
}

std::string model_digest(GPT& model) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (const auto& [name, t] : model->state_dict()) {
    if (name == "head.weight") continue;  // the embedding, again
    at::Tensor c = t.detach().to(at::kCPU).to(at::kFloat).contiguous();
    const auto* p = reinterpret_cast<const unsigned char*>(c.data_ptr<float>());
    for (int64_t i = 0; i < c.numel() * 4; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

}  // namespace tinygpt::checks
