// The references every model check compares against, computed by our model with no cache, and the
// step-by-step comparison of a target's logits with them (SPEC 3, 4).
//  - the uncached greedy run (SPEC 3) and the logits each of its tokens was chosen from;
//  - the full causal forward at each step inside the window;
//  - the banded forward (query i sees keys i-context..i) at every step: the rolling cache's semantics
//    past the window, with no cache at all.
// One Reference is computed per model and prompt and shared by every target checked against it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tinygpt/gpt.h"

namespace tinygpt::checks {

// fp32: a cached step multiplies a 1-token query against cached keys (and, on the fast path,
// through our matvec kernel) while the full forward multiplies the whole window at once; the sums
// run in another order. Measured worst |diff| with the correct caches: ~1e-6 on untrained weights,
// 1.2e-5 on the shipped fixture (docs/perf.md); the faults move logits by 5e-4 to 12.
constexpr double kLogitTolerance = 1e-4;
constexpr const char* kLogitToleranceReason =
    "fp32 with different matmul shapes (1-token step vs full window): noise ~1e-6 to 1e-5, faults >= 5e-4";
// The `self` check compares a target with itself (its cached step against its own prefill of the
// same tokens): every approximation the target makes is in both paths, so the same fp32 bound holds
// for an engine that is not bit-exact with our model (llama.cpp's tanh GELU: 1e-2 against us).
constexpr double kSelfTolerance = 1e-4;
constexpr const char* kSelfToleranceReason =
    "the target against its own prefill: the same arithmetic in other shapes, fp32 noise only (~1e-5)";

// A model's own fp32 noise: the largest |diff| between its full forward of one 128-token row (ids drawn
// from a fixed LCG, inside the context) and the same row's logits from a correct cache, prefilled to half
// its length beside a second row and stepped one token at a time in that batch of 2: the same sums in
// other shapes, as the batch and serving rows compute them. Small on the seed's model; it grows with a
// model's depth and the size of its logits (docs/perf.md).
double fp32_noise_floor(GPT& model);
// verify raises a model's logit bound where kNoiseFloorTrigger times its noise floor is over
// kLogitTolerance, to kNoiseFloorMargin times the floor (the user's --tolerance overrides). Measured
// (docs/perf.md): the floors of the fixture and the zoo (6.7e-6 to 1.1e-5) times 5 stay under 1e-4, so
// their bound is the seed's; on a 135M-parameter model (floor 3.0e-3) the correct caches' rows part from
// the reference by up to 1.4x the floor, and up to 6.6x where cached keys are rotated again by context
// shifts (churn's ten).
constexpr double kNoiseFloorTrigger = 5;
constexpr double kNoiseFloorMargin = 10;

// The prompt of every main run: ids [1, 2, 3], (1, 3) int64 on `device`. The goldens record their
// greedy runs from it, so verify's reference is also theirs; the seed's "first 253 tokens" is context - 3.
at::Tensor main_prompt(c10::Device device = c10::Device(c10::kCPU));

// Logits a reference model computes for the steps of one run, no cache involved.
struct StepReference {
  at::Tensor full;  // (B, inside, V): the causal full forward, for the steps inside the window
  at::Tensor band;  // (B, n, V): the banded forward (rolling-cache semantics), every step
};
// For seq (B, T0 + n) produced from a T0-token prompt: step i predicts token T0 + i.
StepReference reference_for(GPT& model, const at::Tensor& seq, int64_t prompt_len, int64_t n);

// Computed once per (model, prompt, tokens); shared by every target's checks.
struct Reference {
  at::Tensor uncached;         // (B, T0 + tokens) the uncached greedy sequence
  at::Tensor uncached_logits;  // (B, tokens, V) the logits each of its tokens was chosen from
  at::Tensor uncached_margin;  // (tokens) min over rows of top1 - top2 at each step
  StepReference steps;         // the references over the uncached sequence
  // The reference of the first `tokens` steps: greedy runs and references are prefix-consistent.
  Reference prefix(int64_t tokens) const;
};
// prompt (B, T0) int64 (any length), `tokens` >= 1 greedy tokens.
Reference build_reference(GPT& model, const at::Tensor& prompt, int64_t tokens);
// The same reference, its uncached steps computed `workers` at a time: `guess` (B, T0 + tokens) is
// the sequence the run is expected to choose (a golden run's), so every step's window is known before
// the step before it has run. Each step is still the model's uncached forward of its window, and the
// guess is only where the windows come from: every step's choice is checked against it, and from the
// first step whose choice parts from the guess on the run continues one step after another. So the
// result is the uncached loop's own whatever the guess; a right guess only makes it faster (the
// uncached forwards of one run gain nothing from a second intra-op thread: docs/perf.md).
Reference build_reference(GPT& model, const at::Tensor& prompt, int64_t tokens, const at::Tensor& guess, int workers);

// A digest of the weights (64-bit FNV-1a over every tensor's float32 bytes, hex): golden files and
// cached references record it, so neither is ever compared against another model.
std::string model_digest(GPT& model);

// The reference of (model, prompt, tokens) kept on disk between processes, in the folder the
// environment's TINYGPT_REFERENCE_CACHE names (unset: nothing is kept; the test suite sets it to
// build/reference-cache, so verify, equivalence and every conform run of one build share one uncached
// run per model and prompt). An entry is keyed by the weights' bytes, the config, the prompt, the
// tokens and the running program's build id: another model, input or build never reads it. CPU only.
// load: the entry when there is one (nullopt otherwise); store: writes it atomically, and a cache
// that cannot be written is no error; cached_reference: load, or build_reference and store.
std::optional<Reference> load_cached_reference(GPT& model, const at::Tensor& prompt, int64_t tokens);
void store_cached_reference(GPT& model, const at::Tensor& prompt, int64_t tokens, const Reference& r);
Reference cached_reference(GPT& model, const at::Tensor& prompt, int64_t tokens);
// Any other computation of our model kept the same way: the path of the entry of `kind` for `key`
// (a text naming everything else the result depends on), keyed as the references are; "" when nothing
// is kept (TINYGPT_REFERENCE_CACHE unset, a model off the CPU, a program without a build id).
std::string cache_entry_path(GPT& model, const std::string& kind, const std::string& key, const std::string& extension);
// A computation of our model kept as JSON, the ".json" entry of `kind` for `key`: `use` reads the entry
// where there is one; where there is none, or `use` throws on it (unreadable, another shape), `compute`
// makes the JSON, it is written (atomically; a write that fails only costs the next run the computing)
// and `use` reads that. Where nothing is kept, computed and read.
void kept_json(GPT& model, const std::string& kind, const std::string& key, const std::function<nlohmann::json()>& compute,
               const std::function<void(const nlohmann::json&)>& use);

// That reference in parts a caller runs side by side with other work: the guessed run's steps in
// `spans` spans of about equal cost (a step costs its window's length), then finish() - the choices
// checked against the guess, the rest one step after another from where it parted, and the full and
// banded references. A guess for another prompt or length gives no spans (finish() runs every step).
class GuessedReference {
 public:
  GuessedReference(GPT& model, const at::Tensor& prompt, int64_t tokens, const at::Tensor& guess, int spans);
  size_t spans() const { return spans_.size(); }
  // The steps of span i (distinct spans may run on different threads at once).
  void run_span(size_t i);
  // After every span has run.
  Reference finish();

 private:
  GPT model_;
  at::Tensor prompt_, guess_;
  int64_t tokens_;
  std::vector<std::pair<int64_t, int64_t>> spans_;  // [from, to) steps
  std::vector<at::Tensor> ahead_;                   // per step (B, V), from the guessed windows
};

// One run's logits against one reference, step by step, with the precision statistics an
// approximate target is judged by (as llama.cpp's perplexity tool reports them for quantised models).
struct StepDiffs {
  std::vector<double> diffs;  // per step: max |got - reference| over rows and vocabulary
  std::vector<double> kl;     // per step: max over rows of KL(softmax(reference) || softmax(got))
  std::vector<bool> top1;     // per step: every row's argmax agrees with the reference's
  int64_t first_position = 0; // sequence position the first compared step predicts from
  double worst = 0;
  int64_t worst_position = -1;
  std::optional<int64_t> first_position_over;  // first position over the tolerance
  std::optional<int64_t> first_top1_parting;   // first position whose argmax differs
  double margin_at_parting = 0;                // the reference's top-2 margin there
  double top1_agreement() const;  // share of steps whose argmax agrees (1 when none compared)
  double kl_mean() const;
  double kl_max() const;
  // The index of the first step whose KL is over `bound` (a NaN one counts as over), if any.
  std::optional<size_t> first_kl_over(double bound) const;
};

// top1 - top2 of each row of (B, V) logits, min over rows.
double top2_margin(const at::Tensor& logits);
// The least KL(P || Q) of any Q whose top two are level, P = softmax of each row of (B, V) logits,
// max over rows: Q moves mass between P's top two alone, q1 = q2 = (p1 + p2) / 2, so
// KL = p1 ln(2 p1 / (p1 + p2)) + p2 ln(2 p2 / (p1 + p2)). A greedy choice that flips at a step costs
// a distribution at least this much there: what a KL budget must allow for that parting to be its own.
double flip_kl(const at::Tensor& logits);
// got (B, >= m, V) against ref (B, m, V), step by step; step i is at first_position + i.
StepDiffs compare_steps(const at::Tensor& got, const at::Tensor& ref, int64_t first_position, double tol);
// One line for a comparison, with `ref`'s top-2 margin at the first step over tolerance.
std::string describe_steps(const StepDiffs& d, double tol, const at::Tensor& ref);

// Steps, of the n new tokens after the first t0, before sequences a and b (B, >= t0 + n) part in
// any row: n when they never do.
int64_t steps_before_parting(const at::Tensor& a, const at::Tensor& b, int64_t t0, int64_t n);

}  // namespace tinygpt::checks
