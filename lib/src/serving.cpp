#include "tinygpt/serving.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "tinygpt/gpt.h"

namespace tinygpt {

int64_t ServingSchedule::prefill_position(int64_t col, int64_t pad) const { return col - pad; }
int64_t ServingSchedule::step_position(int64_t row_next, int64_t) const { return row_next; }
void ServingSchedule::reuse(KVCache& cache) const { cache.reset(); }

const ServingSchedule& production_serving() {
  static const ServingSchedule s;
  return s;
}

namespace {

// The rows of one batched call as one cache: each row's new entries (its padding cut off) go to its
// own cache, and the keys they return are assembled right-aligned into one padded (R, H, S, hd) batch,
// with which of them each row may see.
class RowsView final : public KVCache {
 public:
  RowsView(std::vector<KVCache*> caches, std::vector<int64_t> pads, int64_t layers)
      : caches_(std::move(caches)), pads_(std::move(pads)), masks_(static_cast<size_t>(layers)) {}

  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v) override {
    const int64_t R = k.size(0), T = k.size(2);
    std::vector<std::pair<at::Tensor, at::Tensor>> seen;  // per row (1, H, S_r, hd)
    int64_t S = 0;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t pad = pads_[r];
      seen.push_back(caches_[r]->update(layer, k.narrow(0, r, 1).narrow(2, pad, T - pad), v.narrow(0, r, 1).narrow(2, pad, T - pad)));
      S = std::max(S, seen.back().first.size(2));
    }
    bool equal = true;
    for (const auto& kv : seen) equal = equal && kv.first.size(2) == S;
    if (equal) {  // rows of one length: no padding to hide (and the decode kernels may take the step)
      masks_[layer] = at::Tensor();
      if (R == 1) return seen[0];
      std::vector<at::Tensor> ks, vs;
      for (const auto& kv : seen) ks.push_back(kv.first), vs.push_back(kv.second);
      return {at::cat(ks, 0), at::cat(vs, 0)};
    }
    at::Tensor K = at::zeros({R, k.size(1), S, k.size(3)}, k.options());  // (R, H, S, hd)
    at::Tensor V = at::zeros_like(K);
    at::Tensor visible = at::zeros({R, S}, k.options().dtype(at::kBool));
    for (int64_t r = 0; r < R; ++r) {
      const int64_t Sr = seen[r].first.size(2);
      K.select(0, r).narrow(1, S - Sr, Sr).copy_(seen[r].first.select(0, 0));
      V.select(0, r).narrow(1, S - Sr, Sr).copy_(seen[r].second.select(0, 0));
      visible.select(0, r).narrow(0, S - Sr, Sr).fill_(true);
    }
    masks_[layer] = visible;
    return {K, V};
  }
  at::Tensor key_mask(int64_t layer) const override { return masks_.at(layer); }
  void reset() override {}
  int64_t length() const override { return 0; }
  int64_t bytes() const override { return 0; }

 private:
  std::vector<KVCache*> caches_;
  std::vector<int64_t> pads_;
  std::vector<at::Tensor> masks_;  // per layer (R, S) bool
};

}  // namespace

RowBatch::RowBatch(GPTImpl& model, RowCacheFactory make_cache, DecodePath path, const ServingSchedule& schedule)
    : model_(model), make_cache_(std::move(make_cache)), path_(path), schedule_(schedule) {
  path_.step = nullptr;
}

std::string RowBatch::unsupported() const {
  auto probe = make_cache_();
  return probe->row_ops_unsupported();
}

RowBatch::Slot& RowBatch::live(int64_t row) {
  if (row < 0 || row >= static_cast<int64_t>(slots_.size()) || !slots_[row].live)
    throw std::invalid_argument("row " + std::to_string(row) + " is not in the batch");
  return slots_[row];
}

int64_t RowBatch::take_slot() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].live) {
      schedule_.reuse(*slots_[i].cache);
      slots_[i].live = true;
      slots_[i].next = 0;
      return static_cast<int64_t>(i);
    }
  slots_.push_back({make_cache_(), 0, true});
  return static_cast<int64_t>(slots_.size()) - 1;
}

at::Tensor RowBatch::run(const std::vector<int64_t>& rows, const at::Tensor& ids, const at::Tensor& positions,
                         const std::vector<int64_t>& pads) {
  std::vector<KVCache*> caches;
  for (int64_t r : rows) caches.push_back(live(r).cache.get());
  RowsView view(caches, pads, model_.config().n_layers);
  at::NoGradGuard no_grad;
  return model_.step_at(ids, view, positions, *path_.policy, path_.kernels);  // (R, V)
}

std::vector<int64_t> RowBatch::add(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits) {
  if (prompts.empty()) throw std::invalid_argument("RowBatch::add: no prompts");
  const int64_t ctx = model_.config().context;
  std::vector<std::vector<int64_t>> fed;
  int64_t T = 0;
  for (const auto& p : prompts) {
    if (p.empty()) throw std::invalid_argument("RowBatch::add: an empty prompt");
    const int64_t w = std::min<int64_t>(static_cast<int64_t>(p.size()), ctx);  // SPEC 4: the last `context`
    fed.emplace_back(p.end() - w, p.end());
    T = std::max(T, w);
  }
  const int64_t R = static_cast<int64_t>(prompts.size());
  const auto dev = model_.emb->weight.device();
  at::Tensor ids = at::zeros({R, T}, at::TensorOptions().dtype(at::kLong));  // left-padded with id 0
  at::Tensor pos = at::zeros({R, T}, at::TensorOptions().dtype(at::kLong));
  std::vector<int64_t> rows, pads;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t w = static_cast<int64_t>(fed[r].size()), pad = T - w;
    for (int64_t c = 0; c < T; ++c) {
      if (c >= pad) ids[r][c] = fed[r][c - pad];
      pos[r][c] = std::max<int64_t>(0, schedule_.prefill_position(c, pad));
    }
    rows.push_back(take_slot());
    pads.push_back(pad);
  }
  check_token_ids(ids, model_.config().vocab_size, "RowBatch::add");
  logits = run(rows, ids.to(dev), pos, pads);
  // SPEC 4: a row's next position counts the tokens fed to it, whatever its prefill's columns.
  for (int64_t r = 0; r < R; ++r) slots_[rows[r]].next = static_cast<int64_t>(fed[r].size());
  return rows;
}

at::Tensor RowBatch::step(const std::vector<int64_t>& rows, const std::vector<int64_t>& ids) {
  if (rows.empty() || rows.size() != ids.size()) throw std::invalid_argument("RowBatch::step: one id per row");
  const int64_t R = static_cast<int64_t>(rows.size());
  at::Tensor idx = at::tensor(ids, at::kLong).view({R, 1});
  check_token_ids(idx, model_.config().vocab_size, "RowBatch::step");
  at::Tensor pos = at::empty({R, 1}, at::kLong);
  int64_t batch_next = 0;
  for (int64_t r : rows) batch_next = std::max(batch_next, live(r).next);
  for (int64_t r = 0; r < R; ++r) pos[r][0] = schedule_.step_position(slots_[rows[r]].next, batch_next);  // SPEC 4: its own count
  at::Tensor out = run(rows, idx.to(model_.emb->weight.device()), pos, std::vector<int64_t>(rows.size(), 0));
  for (int64_t r : rows) ++slots_[r].next;
  return out;
}

at::Tensor RowBatch::extend(int64_t row, const std::vector<int64_t>& ids) {
  Slot& s = live(row);
  const int64_t T = static_cast<int64_t>(ids.size()), ctx = model_.config().context;
  if (T < 1) throw std::invalid_argument("RowBatch::extend: no tokens");
  if (s.next + T > ctx)
    throw std::invalid_argument("RowBatch::extend: a chunk of " + std::to_string(T) + " tokens at position " + std::to_string(s.next) +
                                " ends past the " + std::to_string(ctx) + "-token window");
  at::Tensor idx = at::tensor(ids, at::kLong).view({1, T});
  check_token_ids(idx, model_.config().vocab_size, "RowBatch::extend");
  at::Tensor pos = (at::arange(T, at::kLong) + s.next).view({1, T});  // (1, T): the row's own positions
  at::Tensor out = run({row}, idx.to(model_.emb->weight.device()), pos, {0});
  s.next += T;
  return out;
}

int64_t RowBatch::fork(int64_t row) {
  Slot& parent = live(row);
  auto copy = parent.cache->clone();
  const int64_t next = parent.next;
  const int64_t child = take_slot();
  slots_[child].cache = std::move(copy);
  slots_[child].next = next;
  return child;
}

void RowBatch::truncate(int64_t row, int64_t n) {
  Slot& s = live(row);
  if (n < 0 || n > s.next) throw std::invalid_argument("RowBatch::truncate: cannot drop " + std::to_string(n) + " tokens");
  s.cache->truncate(n);
  s.next -= n;
}

void RowBatch::release(int64_t row) { live(row).live = false; }

std::vector<int64_t> RowBatch::rows() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].live) out.push_back(static_cast<int64_t>(i));
  return out;
}

int64_t RowBatch::next_position(int64_t row) const {
  if (row < 0 || row >= static_cast<int64_t>(slots_.size()) || !slots_[row].live)
    throw std::invalid_argument("row " + std::to_string(row) + " is not in the batch");
  return slots_[row].next;
}

KVCache& RowBatch::cache(int64_t row) { return *live(row).cache; }

}  // namespace tinygpt
