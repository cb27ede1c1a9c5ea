// The conformance kit on our own production caches, exactly as a user runs it on theirs: every
// model check past the window, length and bytes against the formula, reset, batch rows, 2.5
// windows against the banded reference, on the shipped fixture and on untrained weights, CPU and
// CUDA. cuda-graph registers only where LibTorch sees a GPU; its cases skip, saying so, elsewhere.
// ctest runs the untrained cases on the CPU (tests/CMakeLists.txt says what covers the fixture's).
#include <tinygpt/conformance/kv_cache_suite.h>

TINYGPT_REGISTERED_CACHE_CONFORMANCE(Rolling, "rolling");
TINYGPT_REGISTERED_CACHE_CONFORMANCE(Static, "static");
TINYGPT_REGISTERED_CACHE_CONFORMANCE(CudaGraph, "cuda-graph");
