// The fault table: every fault the harness plants, one entry each - its class (the bug behind one
// seam), its name, the bug in one line, the rows that must catch it, the feature it needs and its engine
// twins - beside each other in checks/src/faults/<seam>.cpp. This header is how the rest of the harness
// (verify, inject, the diagnosis, the catalogue, the command line) reads it: which faults there are, and
// which of them a run on a given model must plant.
#pragma once

#include <string>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/config.h"

namespace tinygpt::checks {

// Every fault, in the table's order: the seed's architecture's (positioning, storage, loop, batch,
// serving, speculative), the low-precision caches' (judged by a KL budget), then the zoo's (SPEC 10).
std::vector<const CacheVariant*> fault_table();

// "" when fault `f` is stated for a model of `cfg`; else why not, as the end of a sentence that begins
// with the fault's name: "needs a sliding layer, which this model lacks", or "is stated for the seed's
// architecture; this model sets sliding_window (SPEC 10)".
std::string fault_refusal(const CacheVariant& f, const Config& cfg);

// What a run plants, the one rule every caller states it by.
enum class FaultUse {
  Matrix,     // verify's fault matrix: the faults stated for the model, the low-precision caches' included
  Inject,     // inject's matrix: the faults stated for the model, the exact caches' only
  Diagnosis,  // the candidates a diagnosis weighs: every exact-cache fault that can run on the model (a
              // seed fault's bug is a bug on any architecture), the zoo's where the feature is
};

struct FaultChoice {
  std::vector<const CacheVariant*> faults;  // in the table's order
  std::vector<std::string> left_out;        // each fault (or group of faults) left out of a Matrix run, and why
};

// The faults a run of `use` plants on a model of `cfg`, from `among` (null: the whole table).
FaultChoice faults_for(const Config& cfg, FaultUse use, const std::vector<const CacheVariant*>* among = nullptr);

}  // namespace tinygpt::checks
