#include "tinygpt/blas.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>

namespace tinygpt {

std::string CpuFeatures::to_string() const {
  if (avx512) return "AVX-512, AVX2, FMA";
  if (avx2 && fma) return "AVX2, FMA";
  if (avx) return "AVX";
  if (sse4_2) return "SSE4.2";
  return sse3 ? "SSE3" : "SSE2";
}

CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.vendor = __builtin_cpu_is("intel") ? "GenuineIntel" : __builtin_cpu_is("amd") ? "AuthenticAMD" : "other";
  f.sse3 = __builtin_cpu_supports("sse3");
  f.ssse3 = __builtin_cpu_supports("ssse3");
  f.sse4_2 = __builtin_cpu_supports("sse4.2");
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  f.vendor = "other";
#endif
  return f;
}

namespace {

// The widest vector extension each x86-64 core of OpenBLAS's DYNAMIC_ARCH build uses.
enum Level { kUnknown = 0, kSse3, kSsse3, kSse42, kAvx, kAvx2, kAvx512 };

Level core_level(std::string core) {
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, Level> levels = {
      {"prescott", kSse3},      {"katmai", kSse3},         {"coppermine", kSse3},  {"northwood", kSse3},
      {"banias", kSse3},        {"athlon", kSse3},         {"opteron", kSse3},     {"opteron_sse3", kSse3},
      {"core2", kSsse3},        {"penryn", kSsse3},        {"dunnington", kSsse3}, {"atom", kSsse3},
      {"nehalem", kSse42},      {"barcelona", kSse42},     {"bobcat", kSse42},     {"nano", kSse42},
      {"sandybridge", kAvx},    {"bulldozer", kAvx},       {"piledriver", kAvx},   {"steamroller", kAvx},
      {"excavator", kAvx2},     {"haswell", kAvx2},        {"zen", kAvx2},
      {"skylakex", kAvx512},    {"cooperlake", kAvx512},   {"sapphirerapids", kAvx512}};
  const auto it = levels.find(core);
  return it == levels.end() ? kUnknown : it->second;
}

Level cpu_level(const CpuFeatures& f) {
  if (f.avx512 && f.avx2 && f.fma) return kAvx512;
  if (f.avx2 && f.fma) return kAvx2;
  if (f.avx) return kAvx;
  if (f.sse4_2) return kSse42;
  if (f.ssse3) return kSsse3;
  return f.sse3 ? kSse3 : kUnknown;
}

template <typename F>
F openblas_symbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

std::string better_blas_core(const std::string& chosen, const CpuFeatures& cpu) {
  const Level have = core_level(chosen), can = cpu_level(cpu);
  if (have == kUnknown || have >= can) return "";
  const bool amd = cpu.vendor == "AuthenticAMD";
  switch (can) {
    case kAvx512: return amd ? "Zen" : "SkylakeX";  // OpenBLAS 0.3.21 has no AVX-512 kernels for AMD
    case kAvx2: return amd ? "Zen" : "Haswell";
    case kAvx: return amd ? "Bulldozer" : "Sandybridge";
    case kSse42: return amd ? "Barcelona" : "Nehalem";
    case kSsse3: return "Core2";
    default: return "";
  }
}

bool blas_core_runs_on(const std::string& core, const CpuFeatures& cpu) {
  const Level need = core_level(core);
  return need != kUnknown && need <= cpu_level(cpu);
}

std::string BlasInfo::to_string() const {
  if (core.empty()) return library;
  return library + ", core " + core + " (chosen by " + chosen_by + ")";
}

BlasInfo blas_info() {
  BlasInfo b;
  auto config = openblas_symbol<char* (*)()>("openblas_get_config");
  auto corename = openblas_symbol<char* (*)()>("openblas_get_corename");
  if (!config || !corename) {
    b.library = "not OpenBLAS (no openblas_get_corename in this process)";
    return b;
  }
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... Zen MAX_THREADS=64": its name and version.
  const std::string c = config();
  const size_t version_end = c.find(' ', c.find(' ') + 1);
  b.library = c.substr(0, version_end);
  b.core = corename();
  const char* note = std::getenv("TINYGPT_BLAS_NOTE");
  if (note && *note) b.chosen_by = note;
  else if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced && *forced) b.chosen_by = "OPENBLAS_CORETYPE";
  else b.chosen_by = "OpenBLAS";
  return b;
}

}  // namespace tinygpt
