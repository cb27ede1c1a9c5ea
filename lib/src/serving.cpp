#include "tinygpt/serving.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "tinygpt/gpt.h"
#include "tinygpt/kernel_step.h"
#include "tinygpt/rope.h"
#include "tinygpt/rope_scaling.h"

namespace tinygpt {

int64_t ServingSchedule::prefill_position(int64_t col, int64_t pad) const { return col - pad; }
int64_t ServingSchedule::step_position(int64_t row_next, int64_t) const { return row_next; }
void ServingSchedule::reuse(KVCache& cache) const { cache.reset(); }
int64_t ServingSchedule::extend_position(int64_t row_next, int64_t i) const { return row_next + i; }
int64_t ServingSchedule::step_counter(const std::vector<int64_t>& rows, size_t request) const { return rows[request]; }
int64_t ServingSchedule::reused_prefix(int64_t shared, int64_t prompt_len) const { return std::min(shared, prompt_len - 1); }
int64_t ServingSchedule::shift_rotation(int64_t discard) const { return discard; }
int64_t ServingSchedule::shift_next(int64_t next, int64_t discard) const { return next - discard; }
bool ServingSchedule::reusable(bool live, int64_t peak, int64_t context) const { return !live && peak <= context; }
int64_t ServingSchedule::shifted_token(int64_t) const { return -1; }

const ServingSchedule& production_serving() {
  static const ServingSchedule s;
  return s;
}

namespace {

// The rows of one batched call as one cache: each row's new entries (its padding cut off) go to its
// own cache. For a one-token step (`unpadded`) of rows of different lengths, each row's keys are given
// as they are (rows_seen) and each row attends to its own alone; otherwise the keys are assembled
// right-aligned into one padded (R, H, S, hd) batch, with which of them each row may see.
class RowsView final : public KVCache {
 public:
  RowsView(std::vector<KVCache*> caches, std::vector<int64_t> pads, int64_t layers, bool unpadded)
      : caches_(std::move(caches)), pads_(std::move(pads)), masks_(static_cast<size_t>(layers)),
        rows_(static_cast<size_t>(layers)), unpadded_(unpadded) {}

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
    rows_[layer].clear();
    if (!equal && unpadded_) {
      masks_[layer] = at::Tensor();
      rows_[layer] = std::move(seen);
      return {};
    }
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
  std::vector<std::pair<at::Tensor, at::Tensor>> rows_seen(int64_t layer) const override { return rows_.at(layer); }
  void reset() override {}
  int64_t length() const override { return 0; }
  int64_t bytes() const override { return 0; }

 private:
  std::vector<KVCache*> caches_;
  std::vector<int64_t> pads_;
  std::vector<at::Tensor> masks_;  // per layer (R, S) bool
  std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> rows_;  // per layer, per row (1, H, S_r, hd)
  bool unpadded_;
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
      slots_[i].next = slots_[i].peak = 0;
      slots_[i].tokens.clear();
      return static_cast<int64_t>(i);
    }
  slots_.push_back({make_cache_(), 0, true, {}, 0});
  return static_cast<int64_t>(slots_.size()) - 1;
}

std::pair<int64_t, int64_t> RowBatch::reusable(const std::vector<int64_t>& prompt, const std::vector<int64_t>& taken) const {
  std::pair<int64_t, int64_t> best = {-1, 0};
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    // A live row is no source, nor one that left the window (its first entries are on their way out).
    if (!schedule_.reusable(s.live, s.peak, model_.config().context) ||
        std::find(taken.begin(), taken.end(), static_cast<int64_t>(i)) != taken.end())
      continue;
    const auto n = static_cast<size_t>(std::min<int64_t>(s.next, static_cast<int64_t>(s.tokens.size())));
    const int64_t shared = std::mismatch(prompt.begin(), prompt.begin() + std::min(n, prompt.size()), s.tokens.begin()).first - prompt.begin();
    if (shared > best.second) best = {static_cast<int64_t>(i), shared};
  }
  return best;
}

at::Tensor RowBatch::run(const std::vector<int64_t>& rows, const at::Tensor& ids, const at::Tensor& positions,
                         const std::vector<int64_t>& pads, const AttentionPolicy& policy, bool every) {
  std::vector<KVCache*> caches;
  for (int64_t r : rows) caches.push_back(live(r).cache.get());
  // Rows without left padding (a step, a verify step) each attend to their own keys as they are.
  const bool unpadded = std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; });
  RowsView view(caches, pads, model_.config().n_layers, unpadded);
  at::NoGradGuard no_grad;
  if (every) return step_at_every_with(model_, ids, view, positions, policy, path_.kernels);  // (R, T, V)
  return step_at_with(model_, ids, view, positions, policy, path_.kernels);                  // (R, V)
}

std::vector<int64_t> RowBatch::add(const std::vector<std::vector<int64_t>>& prompts, at::Tensor& logits) {
  if (prompts.empty()) throw std::invalid_argument("RowBatch::add: no prompts");
  const int64_t ctx = model_.config().context;
  const int64_t R = static_cast<int64_t>(prompts.size());
  std::vector<std::vector<int64_t>> fed;
  for (const auto& p : prompts) {
    if (p.empty()) throw std::invalid_argument("RowBatch::add: an empty prompt");
    const int64_t w = std::min<int64_t>(static_cast<int64_t>(p.size()), ctx);  // SPEC 4: the last `context`
    fed.emplace_back(p.end() - w, p.end());
    check_token_ids(at::tensor(fed.back(), at::kLong).unsqueeze(0), model_.config().vocab_size, "RowBatch::add");
  }
  // Prompts that share a prefix with a released row take its slot and keep the shared entries.
  std::vector<int64_t> rows(R, -1), kept(R, 0), claimed;
  for (int64_t r = 0; r < R; ++r) {
    if (static_cast<int64_t>(prompts[r].size()) > ctx) continue;  // its positions start past 0: nothing to share
    const auto [slot, shared] = reusable(fed[r], claimed);
    const int64_t keep = slot < 0 ? 0 : schedule_.reused_prefix(shared, static_cast<int64_t>(fed[r].size()));
    if (keep < 1 || !can_roll_back(slots_[slot], slots_[slot].next - keep)) continue;  // a sliding layer kept too few
    Slot& s = slots_[slot];
    s.cache->truncate(s.next - keep);
    s.next = s.peak = keep;
    s.tokens.resize(static_cast<size_t>(keep));
    s.live = true;
    rows[r] = slot, kept[r] = keep;
    claimed.push_back(slot);
  }
  // The others are prefilled together, left-padded to the longest.
  std::vector<int64_t> fresh;
  int64_t T = 0;
  for (int64_t r = 0; r < R; ++r)
    if (rows[r] < 0) fresh.push_back(r), T = std::max<int64_t>(T, static_cast<int64_t>(fed[r].size()));
  const auto dev = model_.emb->weight.device();
  std::vector<at::Tensor> out(static_cast<size_t>(R));  // (V) each
  if (!fresh.empty()) {
    const int64_t F = static_cast<int64_t>(fresh.size());
    at::Tensor ids = at::zeros({F, T}, at::TensorOptions().dtype(at::kLong));  // left-padded with id 0
    at::Tensor pos = at::zeros({F, T}, at::TensorOptions().dtype(at::kLong));
    std::vector<int64_t> slots, pads;
    for (int64_t f = 0; f < F; ++f) {
      const auto& p = fed[fresh[f]];
      const int64_t w = static_cast<int64_t>(p.size()), pad = T - w;
      for (int64_t c = 0; c < T; ++c) {
        if (c >= pad) ids[f][c] = p[c - pad];
        pos[f][c] = std::max<int64_t>(0, schedule_.prefill_position(c, pad));
      }
      slots.push_back(take_slot());
      pads.push_back(pad);
    }
    const at::Tensor l = run(slots, ids.to(dev), pos, pads, *path_.policy);  // (F, V)
    for (int64_t f = 0; f < F; ++f) {
      Slot& s = slots_[slots[f]];
      advance(s, static_cast<int64_t>(fed[fresh[f]].size()));  // SPEC 4: a row counts the tokens fed to it
      s.tokens = fed[fresh[f]];
      rows[fresh[f]] = slots[f];
      out[fresh[f]] = l[f];
    }
  }
  // The reused rows compute the rest of their prompts (at least the last token) as one chunk.
  for (int64_t r = 0; r < R; ++r) {
    if (kept[r] == 0) continue;
    const int64_t from = std::min<int64_t>(kept[r], static_cast<int64_t>(fed[r].size()) - 1);
    out[r] = extend(rows[r], std::vector<int64_t>(fed[r].begin() + from, fed[r].end()))[0];
  }
  logits = at::stack(out, 0);  // (R, V)
  reused_ = kept;
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
  std::vector<int64_t> counters;
  for (size_t r = 0; r < rows.size(); ++r) counters.push_back(schedule_.step_counter(rows, r));
  for (int64_t r = 0; r < R; ++r) pos[r][0] = schedule_.step_position(slots_.at(counters[r]).next, batch_next);  // SPEC 4: its own count
  at::Tensor out = run(rows, idx.to(model_.emb->weight.device()), pos, std::vector<int64_t>(rows.size(), 0), *path_.policy);
  for (size_t r = 0; r < rows.size(); ++r) advance(slots_[counters[r]], 1), slots_[rows[r]].tokens.push_back(ids[r]);
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
  at::Tensor pos = at::empty({1, T}, at::kLong);  // (1, T): the row's own positions, after its entries
  for (int64_t i = 0; i < T; ++i) pos[0][i] = schedule_.extend_position(s.next, i);
  at::Tensor out = run({row}, idx.to(model_.emb->weight.device()), pos, {0}, *path_.policy);
  advance(s, T);
  s.tokens.insert(s.tokens.end(), ids.begin(), ids.end());
  return out;
}

std::vector<at::Tensor> RowBatch::verify(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& blocks,
                                         const AttentionPolicy& policy) {
  if (rows.empty() || rows.size() != blocks.size()) throw std::invalid_argument("RowBatch::verify: one block per row");
  const int64_t R = static_cast<int64_t>(rows.size());
  int64_t T = 0;
  for (int64_t r = 0; r < R; ++r) {
    const std::string why = live(rows[r]).cache->row_ops_unsupported();
    if (!why.empty()) throw std::invalid_argument("RowBatch::verify: the rows' caches cannot drop a block's padding: " + why);
    if (std::find(rows.begin(), rows.begin() + r, rows[r]) != rows.begin() + r)
      throw std::invalid_argument("RowBatch::verify: row " + std::to_string(rows[r]) + " listed twice");
    if (blocks[r].empty()) throw std::invalid_argument("RowBatch::verify: an empty block");
    T = std::max<int64_t>(T, static_cast<int64_t>(blocks[r].size()));
  }
  std::vector<int64_t> flat_ids, flat_pos;
  for (int64_t r = 0; r < R; ++r) {
    const auto& b = blocks[r];
    const int64_t next = slots_[rows[r]].next;
    for (int64_t i = 0; i < T; ++i) {
      flat_ids.push_back(b[static_cast<size_t>(std::min<int64_t>(i, static_cast<int64_t>(b.size()) - 1))]);  // padded with its last id
      flat_pos.push_back(schedule_.extend_position(next, i));
    }
  }
  const at::Tensor idx = at::tensor(flat_ids, at::kLong).view({R, T}), pos = at::tensor(flat_pos, at::kLong).view({R, T});  // (R, T)
  check_token_ids(idx, model_.config().vocab_size, "RowBatch::verify");
  const at::Tensor out = run(rows, idx.to(model_.emb->weight.device()), pos, std::vector<int64_t>(rows.size(), 0), policy,
                             /*every=*/true);  // (R, T, V)
  std::vector<at::Tensor> logits;
  for (int64_t r = 0; r < R; ++r) {
    Slot& s = slots_[rows[r]];
    const auto& b = blocks[r];
    const int64_t n = static_cast<int64_t>(b.size());
    advance(s, T);
    s.tokens.insert(s.tokens.end(), b.begin(), b.end());
    s.tokens.insert(s.tokens.end(), static_cast<size_t>(T - n), b.back());
    if (n < T) truncate(rows[r], T - n);  // the padding's entries
    logits.push_back(out[r].narrow(0, 0, n));  // (T_r, V)
  }
  return logits;
}

int64_t RowBatch::fork(int64_t row) {
  Slot& parent = live(row);
  auto copy = parent.cache->clone();
  const int64_t next = parent.next, peak = parent.peak;
  std::vector<int64_t> tokens = parent.tokens;
  const int64_t child = take_slot();  // may grow slots_: `parent` is not used after it
  slots_[child].cache = std::move(copy);
  slots_[child].next = next;
  slots_[child].peak = peak;
  slots_[child].tokens = std::move(tokens);
  return child;
}

// Whether a row of `next` tokens can drop its newest n and still hold, in every sliding layer (SPEC 10:
// it keeps w - 1 entries and its rollback history), the window the remaining tokens had. Full layers
// are the seed's: what they may give back is the serving schedule's and the cache's to decide (a
// fault in either must show as the wrong window it computes, not as a refusal here).
bool RowBatch::can_roll_back(const Slot& s, int64_t n) const {
  const Config& cfg = model_.config();
  if (!cfg.has_sliding() || !s.cache->save_unsupported().empty()) return true;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    if (cfg.window(l) == 0) continue;
    const int64_t held = s.cache->stored_length(l);
    if (held - n < std::min(s.next - n, cfg.cache_window(l))) return false;
  }
  return true;
}

void RowBatch::truncate(int64_t row, int64_t n) {
  Slot& s = live(row);
  if (n < 0 || n > s.next) throw std::invalid_argument("RowBatch::truncate: cannot drop " + std::to_string(n) + " tokens");
  if (!can_roll_back(s, n))
    throw std::invalid_argument("RowBatch::truncate: row " + std::to_string(row) + " cannot drop " + std::to_string(n) +
                                " tokens: a layer kept fewer entries than the window the remaining tokens need");
  s.cache->truncate(n);
  s.next -= n;
  s.tokens.resize(s.tokens.size() - static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(s.tokens.size()))));
}

void RowBatch::shift(int64_t row, int64_t keep, int64_t discard) {
  Slot& s = live(row);
  const Config& cfg = model_.config();
  if (keep < 0 || discard < 1 || keep + discard > s.next)
    throw std::invalid_argument("RowBatch::shift: cannot drop " + std::to_string(discard) + " entries after the first " +
                                std::to_string(keep) + " of a row of " + std::to_string(s.next) + " tokens");
  const std::string why = s.cache->save_unsupported();
  if (!why.empty()) throw std::logic_error(why);
  const int64_t hd = cfg.head_dim(), rot = schedule_.shift_rotation(discard);
  std::optional<Rotation> zoo_rope;  // a zoo member's RoPE turns the kept keys back by its own frequencies (SPEC 10)
  if (!is_seed_rope(cfg)) {
    RopeSpec spec = rope_spec(cfg);
    if (!schedule_.shift_uses_rope_scaling()) spec.scaling = RopeScaling{};
    zoo_rope.emplace(spec, cfg.rope_pairing);
  }
  at::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, at::Tensor>> kept(static_cast<size_t>(cfg.n_layers));
  at::Tensor cos, sin;  // (later, hd/2): the angle -rot * 10000^(-2j/hd), in float32 as RoPE's table
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    auto [K, V] = s.cache->stored(l);  // (1, G, S, hd): positions next - S .. next - 1
    const int64_t S = K.defined() ? K.size(2) : 0, lo = s.next - S;
    if (cfg.window(l) == 0 && S != s.next)
      throw std::invalid_argument("RowBatch::shift: row " + std::to_string(row) + " keeps " + std::to_string(S) + " entries of its " +
                                  std::to_string(s.next) + " tokens; a context shift needs every one (a row inside the window)");
    // A sliding layer keeps only its window (SPEC 10): the shifted row's next query must still find
    // the w - 1 keys before it among what the layer holds, counted in the shifted sequence.
    const int64_t after = s.next - discard, need = std::min(after, cfg.cache_window(l));
    const int64_t oldest = after - need < keep ? after - need : after - need + discard;  // its old position
    if (need > 0 && oldest < lo)
      throw std::invalid_argument("RowBatch::shift: row " + std::to_string(row) + "'s layer " + std::to_string(l) + " keeps positions " +
                                  std::to_string(lo) + " .. " + std::to_string(s.next - 1) + "; the shifted row needs position " +
                                  std::to_string(oldest));
    if (lo > 0) {  // pad the sliding layer's view back to position 0 so the slicing below counts positions
      K = at::cat({at::zeros({K.size(0), K.size(1), lo, K.size(3)}, K.options()), K}, 2);
      V = at::cat({at::zeros({V.size(0), V.size(1), lo, V.size(3)}, V.options()), V}, 2);
    }
    const int64_t later = s.next - keep - discard;
    at::Tensor k2 = K.narrow(2, keep + discard, later), v2 = V.narrow(2, keep + discard, later);
    if (later > 0 && rot != 0 && zoo_rope) {
      k2 = zoo_rope->turn(k2, -rot);
    } else if (later > 0 && rot != 0) {
      if (!cos.defined()) {
        const auto f32 = at::TensorOptions().dtype(at::kFloat).device(K.device());
        const at::Tensor angle = at::pow(10000.0, -at::arange(0, hd, 2, f32) / static_cast<double>(hd)) * static_cast<double>(-rot);
        cos = angle.cos().unsqueeze(0).expand({later, hd / 2}).contiguous();
        sin = angle.sin().unsqueeze(0).expand({later, hd / 2}).contiguous();
      }
      k2 = rope_rotate(k2.contiguous(), cos, sin);
    }
    at::Tensor kk = at::cat({K.narrow(2, 0, keep), k2}, 2), vv = at::cat({V.narrow(2, 0, keep), v2}, 2);  // (1, G, after, hd)
    // The first shifted position whose entry is real (not padding): positions map monotonically.
    const int64_t q0 = lo <= keep ? lo : (lo <= keep + discard ? keep : lo - discard);
    if (lo > 0) kk = kk.narrow(2, q0, after - q0), vv = vv.narrow(2, q0, after - q0);  // drop the padding again
    kept[static_cast<size_t>(l)] = {kk, vv};
  }
  s.cache->reset();
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const auto& [k, v] = kept[static_cast<size_t>(l)];
    if (k.size(2) > 0) s.cache->update(l, k.contiguous(), v.contiguous());  // every kept entry in one append
  }
  if (const double gain = schedule_.shift_key_gain(cfg); gain != 1.0) {
    for (auto& other : slots_) {  // every row's keys, the shifted one's included (its new ones above)
      if (!other.cache || !other.cache->save_unsupported().empty()) continue;
      std::vector<std::pair<at::Tensor, at::Tensor>> kv;
      for (int64_t l = 0; l < cfg.n_layers; ++l) kv.push_back(other.cache->stored(l));
      other.cache->reset();
      for (int64_t l = 0; l < cfg.n_layers; ++l) {
        const auto& [k, v] = kv[static_cast<size_t>(l)];
        if (k.defined() && k.size(2) > 0) other.cache->update(l, (k * gain).contiguous(), v.contiguous());
      }
    }
  }
  s.next = schedule_.shift_next(s.next, discard);
  s.peak = std::max(s.next, int64_t{0});
  s.tokens.erase(s.tokens.begin() + std::min<int64_t>(keep, static_cast<int64_t>(s.tokens.size())),
                 s.tokens.begin() + std::min<int64_t>(keep + discard, static_cast<int64_t>(s.tokens.size())));
  for (size_t i = static_cast<size_t>(keep); i < s.tokens.size(); ++i) s.tokens[i] = schedule_.shifted_token(s.tokens[i]);  // computed beside dropped tokens
}

void RowBatch::release(int64_t row) { live(row).live = false; }

RowBatch::RowState RowBatch::save(int64_t row) const {
  if (row < 0 || row >= static_cast<int64_t>(slots_.size()) || !slots_[row].live)
    throw std::invalid_argument("row " + std::to_string(row) + " is not in the batch");
  const Slot& s = slots_[row];
  const std::string why = s.cache->save_unsupported();
  if (!why.empty()) throw std::logic_error(why);
  RowState st;
  for (int64_t l = 0; l < model_.config().n_layers; ++l) {
    auto kv = s.cache->stored(l);
    if (kv.first.defined()) kv = {kv.first.to(at::kCPU, at::kFloat), kv.second.to(at::kCPU, at::kFloat)};
    st.layers.push_back(std::move(kv));
  }
  st.next = s.next, st.peak = s.peak, st.tokens = s.tokens;
  return st;
}

int64_t RowBatch::restore(const RowState& st) {
  const Config& cfg = model_.config();
  if (static_cast<int64_t>(st.layers.size()) != cfg.n_layers)
    throw std::invalid_argument("RowBatch::restore: a state of " + std::to_string(st.layers.size()) + " layers for a " +
                                std::to_string(cfg.n_layers) + "-layer model");
  const int64_t hd = cfg.head_dim(), G = cfg.kv_heads();
  int64_t stored = 0;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const auto& [k, v] = st.layers[static_cast<size_t>(l)];
    const int64_t S = k.defined() ? k.size(2) : 0;
    if (k.defined() != v.defined() || (k.defined() && (k.dim() != 4 || !k.sizes().equals(v.sizes()) || k.size(0) != 1 ||
                                                       k.size(1) != G || k.size(3) != hd)))
      throw std::invalid_argument("RowBatch::restore: a layer's entries are not (1, " + std::to_string(G) + ", S, " +
                                  std::to_string(hd) + ") keys and values");
    // Each layer keeps its own window (a sliding layer fewer entries, SPEC 10) and its rollback history.
    if (S > cfg.cache_window(l) + kRollbackEntries || S > st.next)
      throw std::invalid_argument("RowBatch::restore: a row at position " + std::to_string(st.next) + " cannot keep " +
                                  std::to_string(S) + " entries in layer " + std::to_string(l));
    if (cfg.window(l) == 0 && stored > 0 && S != stored)
      throw std::invalid_argument("RowBatch::restore: the layers keep different numbers of entries");
    if (cfg.window(l) == 0) stored = S;
  }
  if (st.peak < st.next)
    throw std::invalid_argument("RowBatch::restore: a row at position " + std::to_string(st.next) + " cannot have peaked at " +
                                std::to_string(st.peak));
  const int64_t row = take_slot();
  Slot& s = slots_[row];
  const auto dev = model_.emb->weight.device();
  at::NoGradGuard no_grad;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const auto& [k, v] = st.layers[static_cast<size_t>(l)];
    if (k.defined()) s.cache->update(l, k.to(dev), v.to(dev));  // every entry in one append: what the saved cache kept
  }
  s.next = st.next;  // past the window the cache holds fewer entries than the row has tokens: the row's position, not its cache's length
  s.peak = st.peak;
  s.tokens = st.tokens;
  return row;
}

namespace {

constexpr char kStateMagic[8] = {'T', 'G', 'R', 'O', 'W', 'S', 'T', '1'};

void put(std::string& out, int64_t x) { out.append(reinterpret_cast<const char*>(&x), sizeof x); }
void put(std::string& out, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  out.append(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<size_t>(c.numel()) * sizeof(float));
}

class Reader {
 public:
  explicit Reader(const std::string& b) : b_(b) {}
  int64_t i64(int64_t lo, int64_t hi, const char* what) {
    int64_t x = 0;
    take(&x, sizeof x);
    if (x < lo || x > hi) throw std::invalid_argument(std::string("row state: ") + what + " " + std::to_string(x) + " out of range");
    return x;
  }
  at::Tensor floats(std::vector<int64_t> shape) {
    at::Tensor t = at::empty(shape, at::kFloat);
    take(t.data_ptr<float>(), static_cast<size_t>(t.numel()) * sizeof(float));
    return t;
  }
  void take(void* to, size_t n) {
    if (n > b_.size() - at_) throw std::invalid_argument("row state: truncated");
    std::memcpy(to, b_.data() + at_, n);
    at_ += n;
  }
  bool done() const { return at_ == b_.size(); }

 private:
  const std::string& b_;
  size_t at_ = 0;
};

}  // namespace

std::string to_bytes(const RowBatch::RowState& st) {
  std::string out(kStateMagic, sizeof kStateMagic);
  put(out, static_cast<int64_t>(st.layers.size()));
  put(out, st.next);
  put(out, st.peak);
  put(out, static_cast<int64_t>(st.tokens.size()));
  for (int64_t id : st.tokens) put(out, id);
  for (const auto& [k, v] : st.layers) {
    put(out, k.defined() ? 1 : 0);
    if (!k.defined()) continue;
    for (int64_t d = 0; d < 4; ++d) put(out, k.size(d));
    put(out, k.to(at::kCPU, at::kFloat));
    put(out, v.to(at::kCPU, at::kFloat));
  }
  return out;
}

RowBatch::RowState row_state_from_bytes(const std::string& bytes) {
  constexpr int64_t kBig = int64_t{1} << 40;
  Reader in(bytes);
  char magic[sizeof kStateMagic];
  in.take(magic, sizeof magic);
  if (std::memcmp(magic, kStateMagic, sizeof magic) != 0) throw std::invalid_argument("row state: not a tinygpt row state");
  RowBatch::RowState st;
  const int64_t layers = in.i64(1, 1 << 16, "layer count");
  st.next = in.i64(0, kBig, "position");
  st.peak = in.i64(0, kBig, "peak");
  const int64_t n = in.i64(0, static_cast<int64_t>(bytes.size() / sizeof(int64_t)), "token count");
  for (int64_t i = 0; i < n; ++i) st.tokens.push_back(in.i64(-1, kBig, "token id"));
  for (int64_t l = 0; l < layers; ++l) {
    if (in.i64(0, 1, "layer flag") == 0) {
      st.layers.emplace_back();
      continue;
    }
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (int64_t d = 0; d < 4; ++d) {
      shape.push_back(in.i64(1, 1 << 20, "dimension"));
      numel *= shape.back();
      if (numel > static_cast<int64_t>(bytes.size())) throw std::invalid_argument("row state: truncated");
    }
    at::Tensor k = in.floats(shape), v = in.floats(shape);
    st.layers.emplace_back(k, v);
  }
  if (!in.done()) throw std::invalid_argument("row state: bytes after the last layer");
  return st;
}

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

const Config& RowBatch::config() const { return model_.config(); }

c10::Device RowBatch::device() const { return model_.emb->weight.device(); }

}  // namespace tinygpt
