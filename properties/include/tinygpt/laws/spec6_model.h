// A model of SPEC 6 written for testing only: plain C++ over std::vector, no LibTorch, each step in
// the seed's order, short enough to check against SPEC 6 by eye. The property suite compares the
// library with it, so a mistake the library's stages share with its own filtered_probs cannot hide.
//
// Precision follows SPEC 6 ("on a float32 copy"): the penalty and the temperature round to float32
// as the library's tensor ops do (a float tensor op with a double scalar computes in float32), so
// ties and the top-k cut are exact; probabilities are then computed in double. The nucleus cut
// compares a float32 cumulative sum in the library with a double one here, so a token whose mass
// ranked above lies within `slack` of top_p may go either way (Fate::Either).
#pragma once

#include <cstdint>
#include <vector>

namespace tinygpt::props::spec6 {

struct Settings {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  double penalty = 1.0;      // 1 = off
};

enum class Fate { Kept, Dropped, Either };

// 1. Each DISTINCT id of the history once: s / penalty if s > 0, else s * penalty.
std::vector<float> penalize(std::vector<float> s, const std::vector<int64_t>& history, double penalty);
// 2. s / temperature (temperature > 0).
std::vector<float> scale(std::vector<float> s, double temperature);
// 3. Survivors of top-k: s >= the k-th largest score (ties with it survive). k = 0: all.
std::vector<bool> top_k(const std::vector<float>& s, int64_t k);
// 4. Fates under top-p: rank by score descending; p = softmax over the top-k survivors; a token is
// dropped when the mass ranked above it is >= top_p. The top always stays. SPEC 6 leaves the order
// among EQUAL scores open (the seed sorts with an unstable sort), so where the boundary falls inside
// a group of tied tokens, every token of the group is Either: any order among them is allowed.
std::vector<Fate> top_p(const std::vector<float>& s, const std::vector<bool>& alive, double top_p, double slack);

// Stages 1-4: each token's fate (Dropped also for top-k's cut) and the scores after stage 2.
struct Filtered {
  std::vector<float> scores;
  std::vector<Fate> fate;
};
// With `ties_at_k_either`, every token tied with the k-th score is Either instead of Kept: the
// generic laws then do not test top-k's tie rule (an engine that keeps exactly k tokens passes them),
// which has fixed checks of its own, named for it.
Filtered filter(const std::vector<float>& logits, const std::vector<int64_t>& history, const Settings& s, double slack,
                bool ties_at_k_either = false);

// 5. The distribution draws follow: softmax of `scores` over `support`, in double.
std::vector<double> distribution(const std::vector<float>& scores, const std::vector<bool>& support);

// temperature == 0: argmax after the penalty, the first index on ties.
int64_t greedy(const std::vector<float>& logits, const std::vector<int64_t>& history, double penalty);

}  // namespace tinygpt::props::spec6
