// A low-precision KV type's rows, each also run on the same engine with an fp32 cache: every request
// the checks send the target goes to the baseline as well (the same prompts and ids, its row ids
// mapped), and each answer's logits are compared with the baseline's. What the KV type costs on every
// row, against the one reference that differs from it only by the cache's precision.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tinygpt/checks/reference.h"
#include "tinygpt/checks/target.h"

namespace tinygpt::checks {

class MirrorTarget final : public DecodeTarget, public RowServing {
 public:
  // Both must outlive the mirror.
  MirrorTarget(DecodeTarget& main, DecodeTarget& baseline);
  ~MirrorTarget() override;

  // The answers compared since the last take(), cleared: one "step" per answer row (KL(baseline ||
  // main), max |diff|, whether the argmax agrees), in the order they came.
  StepDiffs take();

  std::string name() const override { return main_->name(); }
  int64_t context() const override { return main_->context(); }
  void reset() override;
  at::Tensor prefill(const at::Tensor& ids) override;
  at::Tensor step(const at::Tensor& ids) override;
  const props::SamplerUnderTest& sampler() const override { return main_->sampler(); }
  std::string loop_name() const override { return main_->loop_name(); }
  // Rows where the main target has them (the baseline must too: its offer asks both).
  RowServing& serving() override;
  std::vector<int64_t> add_rows(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits) override;
  at::Tensor step_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids) override;
  at::Tensor extend_row(int64_t row, const std::vector<int64_t>& ids) override;
  int64_t fork_row(int64_t row) override;
  void truncate_row(int64_t row, int64_t n) override;
  void release_row(int64_t row) override;
  int set_threads(int n) override;
  std::vector<int64_t> reused() const override { return main_->serving().reused(); }
  std::string save_row(int64_t row) override;
  int64_t restore_row(const std::string& state) override;
  void shift_row(int64_t row, int64_t keep, int64_t discard) override;
  // Both targets' second instances, mirrored the same way (their comparisons count in this tally).
  std::unique_ptr<DecodeTarget> second_instance() const override;
  // Speculative runs go to the judged engine alone: its own loop, not requests the baseline can mirror.
  SpeculativeAnswer speculate(const SpeculativeRequest& r) override { return main_->speculate(r); }
  Generation seeded(const at::Tensor& prompt, int64_t n, const SamplingSettings& s, uint64_t seed) override {
    return main_->seeded(prompt, n, s, seed);
  }


 protected:
  // The main target's offer where the baseline offers the same (an operation either lacks is missing,
  // the baseline's reason said as its own), the smaller row limit, the main target's deviations.
  Offers make_offers() const override;
 private:
  struct Shared {
    StepDiffs tally;
    std::map<std::string, std::string> states;  // the main target's saved state -> the baseline's
  };
  MirrorTarget(std::unique_ptr<DecodeTarget> main, std::unique_ptr<DecodeTarget> baseline, std::shared_ptr<Shared> shared);
  void compare(const at::Tensor& got, const at::Tensor& base);  // (R, V) each
  int64_t base_row(int64_t row) const;

  std::unique_ptr<DecodeTarget> own_main_, own_base_;
  DecodeTarget* main_;
  DecodeTarget* base_;
  std::shared_ptr<Shared> shared_;
  std::map<int64_t, int64_t> rows_;  // the main target's row id -> the baseline's
};

}  // namespace tinygpt::checks
