#include "mirror_target.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace tinygpt::checks {

MirrorTarget::MirrorTarget(DecodeTarget& main, DecodeTarget& baseline)
    : main_(&main), base_(&baseline), shared_(std::make_shared<Shared>()) {}

MirrorTarget::MirrorTarget(std::unique_ptr<DecodeTarget> main, std::unique_ptr<DecodeTarget> baseline, std::shared_ptr<Shared> shared)
    : own_main_(std::move(main)), own_base_(std::move(baseline)), main_(own_main_.get()), base_(own_base_.get()), shared_(std::move(shared)) {}

MirrorTarget::~MirrorTarget() = default;

StepDiffs MirrorTarget::take() {
  StepDiffs t = std::move(shared_->tally);
  shared_->tally = {};
  return t;
}

void MirrorTarget::compare(const at::Tensor& got_in, const at::Tensor& base_in) {
  const at::Tensor got = got_in.to(at::kCPU).reshape({1, -1, got_in.size(-1)});    // (1, R, V): each row a step
  const at::Tensor base = base_in.to(at::kCPU).reshape({1, -1, base_in.size(-1)});  // (1, R, V)
  if (got.sizes() != base.sizes()) return;  // a wrong shape is the main target's check to fail
  const StepDiffs d = compare_steps(got, base, 0, std::numeric_limits<double>::infinity());
  StepDiffs& t = shared_->tally;
  t.kl.insert(t.kl.end(), d.kl.begin(), d.kl.end());
  t.diffs.insert(t.diffs.end(), d.diffs.begin(), d.diffs.end());
  t.top1.insert(t.top1.end(), d.top1.begin(), d.top1.end());
}

int64_t MirrorTarget::base_row(int64_t row) const {
  const auto it = rows_.find(row);
  if (it == rows_.end()) throw std::logic_error("mirror: row " + std::to_string(row) + " has no baseline row");
  return it->second;
}

void MirrorTarget::reset() {
  main_->reset();
  base_->reset();
  rows_.clear();
}

at::Tensor MirrorTarget::prefill(const at::Tensor& ids) {
  const at::Tensor l = main_->prefill(ids);
  compare(l, base_->prefill(ids));
  return l;
}

at::Tensor MirrorTarget::step(const at::Tensor& ids) {
  const at::Tensor l = main_->step(ids);
  compare(l, base_->step(ids));
  return l;
}

Offers MirrorTarget::make_offers() const {
  const Offers& m = main_->offers();
  const Offers& b = base_->offers();
  Offers o = m;
  for (unsigned i = 0; i < kOpCount; ++i)
    if (o.missing[i].empty() && !b.missing[i].empty()) o.missing[i] = "its f32 baseline: " + b.missing[i];
  if (o.no_rows.empty() && !b.no_rows.empty()) o.no_rows = "its f32 baseline: " + b.no_rows;
  o.max_rows = !m.max_rows ? b.max_rows : !b.max_rows ? m.max_rows : std::min(*m.max_rows, *b.max_rows);
  return o;  // the sampler, the drafts and the rules are the main target's alone (speculate goes to it only)
}

RowServing& MirrorTarget::serving() {
  main_->serving();  // throws where the main target has no rows
  return *this;
}

std::vector<int64_t> MirrorTarget::add_rows(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits) {
  const std::vector<int64_t> ids = main_->serving().add_rows(prompts, logits);
  at::Tensor base;
  const std::vector<int64_t> bids = base_->serving().add_rows(prompts, base);
  for (size_t i = 0; i < ids.size() && i < bids.size(); ++i) rows_[ids[i]] = bids[i];
  compare(logits, base);
  return ids;
}

at::Tensor MirrorTarget::step_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids) {
  const at::Tensor l = main_->serving().step_rows(rows, ids);
  std::vector<int64_t> b;
  for (int64_t r : rows) b.push_back(base_row(r));
  compare(l, base_->serving().step_rows(b, ids));
  return l;
}

at::Tensor MirrorTarget::extend_row(int64_t row, const std::vector<int64_t>& ids) {
  const at::Tensor l = main_->serving().extend_row(row, ids);
  compare(l, base_->serving().extend_row(base_row(row), ids));
  return l;
}

int64_t MirrorTarget::fork_row(int64_t row) {
  const int64_t child = main_->serving().fork_row(row);
  rows_[child] = base_->serving().fork_row(base_row(row));
  return child;
}

void MirrorTarget::truncate_row(int64_t row, int64_t n) {
  main_->serving().truncate_row(row, n);
  base_->serving().truncate_row(base_row(row), n);
}

void MirrorTarget::release_row(int64_t row) {
  main_->serving().release_row(row);
  base_->serving().release_row(base_row(row));
  rows_.erase(row);
}

int MirrorTarget::set_threads(int n) {
  base_->set_threads(n);
  return main_->set_threads(n);
}

std::string MirrorTarget::save_row(int64_t row) {
  std::string s = main_->serving().save_row(row);
  shared_->states[s] = base_->serving().save_row(base_row(row));
  return s;
}

int64_t MirrorTarget::restore_row(const std::string& state) {
  const auto it = shared_->states.find(state);
  if (it == shared_->states.end()) throw std::logic_error("mirror: a state the mirror did not save");
  const int64_t row = main_->serving().restore_row(state);
  rows_[row] = base_->serving().restore_row(it->second);
  return row;
}

void MirrorTarget::shift_row(int64_t row, int64_t keep, int64_t discard) {
  main_->serving().shift_row(row, keep, discard);
  base_->serving().shift_row(base_row(row), keep, discard);
}

std::unique_ptr<DecodeTarget> MirrorTarget::second_instance() const {
  auto m = main_->second_instance();  // throws where the main target makes none (its offer says so)
  if (!base_->offers().no_second_instance.empty()) return m;  // no baseline there: the second instance's answers are not compared
  auto b = base_->second_instance();
  return std::unique_ptr<DecodeTarget>(new MirrorTarget(std::move(m), std::move(b), shared_));
}

}  // namespace tinygpt::checks
