#include "runtime.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "tinygpt/blas.h"
#include "tinygpt/kernels.h"

namespace tinygpt::cli {

namespace {

// libgomp's spins before a waiting thread sleeps when tinygpt chooses the policy (measured, perf.md).
constexpr const char* kSpinCount = "10000";

bool set_in_environment(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

// The OpenBLAS core to run with, and why; "" when OpenBLAS's own choice stands.
// TINYGPT_BLAS_CORE: unset - fix a fallback unless the user set OPENBLAS_CORETYPE; "auto" - fix a
// fallback whatever OPENBLAS_CORETYPE says; "openblas" - keep OpenBLAS's choice; a core's name - that.
std::string wanted_core(const BlasInfo& blas, std::string& why) {
  const char* v = std::getenv("TINYGPT_BLAS_CORE");
  const std::string choice = v ? v : "";
  if (blas.core.empty() || choice == "openblas") return "";
  if (!choice.empty() && choice != "auto") {
    if (!blas_core_runs_on(choice, cpu_features())) {
      std::fprintf(stderr, "error: TINYGPT_BLAS_CORE=%s is not an OpenBLAS core this CPU (%s) can run; use auto, openblas or a core such as %s\n",
                   choice.c_str(), cpu_features().to_string().c_str(), cpu_features().avx2 ? "Haswell, Zen or Prescott" : "Prescott");
      std::exit(2);
    }
    why = "TINYGPT_BLAS_CORE";
    // OpenBLAS chose that core itself (a fallback it takes on this CPU): nothing to change, but the
    // reports still say who asked for it.
    if (choice == blas.core) setenv("TINYGPT_BLAS_NOTE", why.c_str(), 1);
    return choice == blas.core ? "" : choice;
  }
  if (choice.empty() && set_in_environment("OPENBLAS_CORETYPE")) return "";
  const CpuFeatures cpu = cpu_features();
  const std::string better = better_blas_core(blas.core, cpu);
  if (!better.empty())
    why = "tinygpt: OpenBLAS had chosen its " + blas.core + " kernels on a CPU with " + cpu.to_string() +
          " (TINYGPT_BLAS_CORE=openblas keeps them)";
  return better;
}

}  // namespace

bool runs_the_model(const std::string& command) {
  static const std::set<std::string> commands = {"verify", "equivalence", "inject", "conform", "bench", "golden",
                                                 "generate", "sample-grid", "train", "cross-device", "--version"};
  return commands.count(command) > 0;
}

void prepare_process(int argc, char** argv) {
  // Once: the re-executed process finds this set, says what was changed, and goes on.
  if (set_in_environment("TINYGPT_PREPARED")) {
    unsetenv("TINYGPT_PREPARED");
    const char* note = std::getenv("TINYGPT_BLAS_NOTE");
    const char* core = std::getenv("OPENBLAS_CORETYPE");
    // Said only when the run goes on: a bad TINYGPT_KERNELS is refused in its one line (main).
    bool kernels_ok = true;
    try {
      kernel_path();
    } catch (const std::exception&) {
      kernels_ok = false;
    }
    if (kernels_ok && note && std::string(note).rfind("tinygpt:", 0) == 0 && core)
      std::fprintf(stderr, "%s: running with its %s kernels\n", note, core);
    return;
  }
  if (argc < 2 || !runs_the_model(argv[1])) return;
  bool again = false;
  // OpenMP's waiting threads: a bounded spin, then sleep (docs/perf.md, "Waiting threads"). A decode
  // step opens a parallel region per kernel, microseconds apart: a worker that sleeps between them
  // pays a wake-up per region (two threads ran slower than one at batch 1), one that spins without end
  // holds a core a busy neighbour needs. libgomp spins GOMP_SPINCOUNT times (10,000: 0.2 ms on the
  // 2-core AMD EPYC) before it sleeps: the regions of a running loop find it awake, a pause between
  // phases lets it sleep.
  if (!set_in_environment("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    if (!set_in_environment("GOMP_SPINCOUNT")) setenv("GOMP_SPINCOUNT", kSpinCount, 1);
    again = true;
  }
  std::string why;
  const std::string core = wanted_core(blas_info(), why);
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string user_core = before ? before : "";
  if (!core.empty()) {
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    setenv("TINYGPT_BLAS_NOTE", why.c_str(), 1);
    again = true;
  }
  if (!again) return;
  setenv("TINYGPT_PREPARED", "1", 1);
  // The resolved path, not /proc/self/exe: the kernel names a process after the file it executes, and
  // `ps`, `pgrep tinygpt` and a CI step stopping a hung job look for "tinygpt", not "exe".
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    execv(self, argv);
  } else {
    execv("/proc/self/exe", argv);
  }
  // exec failed: carry on in this process as it is; the reports name the core OpenBLAS runs.
  if (!core.empty()) {
    if (user_core.empty()) unsetenv("OPENBLAS_CORETYPE");
    else setenv("OPENBLAS_CORETYPE", user_core.c_str(), 1);
    unsetenv("TINYGPT_BLAS_NOTE");
  }
}

}  // namespace tinygpt::cli
