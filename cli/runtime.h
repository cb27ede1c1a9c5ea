// The process environment the tool's threads and LibTorch's BLAS need, set before they start.
// OpenMP (LibTorch's intra-op threads and OpenBLAS's) reads its wait policy, and OpenBLAS its core,
// when their libraries load - before main - so a command that runs the model re-executes itself
// once with them set:
//  - OMP_WAIT_POLICY=PASSIVE unless the user set it: a thread that waits for work sleeps instead of
//    spinning on a core that another process (or the tool's other thread) needs;
//  - OPENBLAS_CORETYPE=<the CPU's core> when OpenBLAS fell back to kernels older than the CPU
//    (blas.h), unless the user set OPENBLAS_CORETYPE. TINYGPT_BLAS_CORE=<core> chooses a core,
//    =openblas keeps OpenBLAS's own choice, =auto fixes a fallback even under OPENBLAS_CORETYPE.
#pragma once

#include <string>

namespace tinygpt::cli {

// Re-executes the program (/proc/self/exe, the same arguments) when the environment needs a change
// for the command in argv[1]; returns normally when it does not, or when the re-execution failed
// (the reports then name the core as OpenBLAS chose it).
void prepare_process(int argc, char** argv);

// The commands that run the model (and so LibTorch's threads and BLAS).
bool runs_the_model(const std::string& command);

}  // namespace tinygpt::cli
