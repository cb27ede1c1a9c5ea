// The serving layer (serving.h): rows of different lengths, forks and rollbacks on one-row caches.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tinygpt/generate.h"
#include "tinygpt/ring_kv_cache.h"
#include "tinygpt/serving.h"
#include "tinygpt/static_kv_cache.h"

namespace tinygpt {
namespace {

Config small() {
  Config c;
  c.vocab_size = 64;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.context = 16;
  return c;
}

class Serving : public ::testing::Test {
 protected:
  void SetUp() override { model->eval(); }
  Config cfg = small();
  GPT model{cfg, 3};
  // A sequence's per-step logits through the production loop alone (batch 1): (n, V).
  at::Tensor alone(const std::vector<int64_t>& prompt, const std::vector<int64_t>& next, KVCache& cache) {
    Recorder keep;
    at::NoGradGuard no_grad;
    // Teacher-forced by the tokens the batched run chose, so both see the same sequence.
    size_t i = 0;
    generate_cached(model, at::tensor(prompt, at::kLong).unsqueeze(0), static_cast<int64_t>(next.size()),
                    [&](const at::Tensor&, const at::Tensor&) { return at::tensor(std::vector<int64_t>{next[i++]}, at::kLong); },
                    cache, {}, keep.observer());
    return keep.stacked()[0];
  }
};

// Rows of 3, 7 and 12 tokens prefilled and stepped together, past the window: each row as alone.
TEST_F(Serving, RaggedRowsEqualEachRowAlone) {
  RowBatch batch(*model, [this] { return std::make_unique<RollingKVCache>(cfg); }, DecodePath{});
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10}, {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}};
  at::Tensor logits;
  const auto rows = batch.add(prompts, logits);
  ASSERT_EQ(rows.size(), 3u);
  std::vector<std::vector<at::Tensor>> got(3);
  std::vector<std::vector<int64_t>> next(3);
  for (int step = 0; step < 30; ++step) {  // the 3-token row reaches position 33, twice the window
    std::vector<int64_t> ids;
    for (int r = 0; r < 3; ++r) {
      got[r].push_back(logits[r].clone());
      next[r].push_back(logits[r].argmax().item<int64_t>());
      ids.push_back(next[r].back());
    }
    logits = batch.step(rows, ids);
  }
  for (int r = 0; r < 3; ++r) {
    RollingKVCache cache(cfg);
    const at::Tensor want = alone(prompts[r], next[r], cache);
    EXPECT_LT((at::stack(got[r]) - want).abs().max().item<double>(), 1e-5) << "row " << r;
    EXPECT_EQ(batch.next_position(rows[r]), static_cast<int64_t>(prompts[r].size()) + 30) << "positions count the row's own tokens";
  }
}

// A rollback restores the exact state: after k drafts and a truncate of j, the rolling and static
// caches hold what a cache that never saw the rejected tokens holds, past the window too.
TEST_F(Serving, TruncateRestoresTheWindowTheRemainingSequenceHad) {
  for (int which = 0; which < 2; ++which) {
    auto make = [&]() -> std::unique_ptr<KVCache> {
      if (which == 0) return std::make_unique<RollingKVCache>(cfg);
      return std::make_unique<StaticKVCache>(cfg);
    };
    auto drafted = make(), straight = make();
    at::Generator g = at::detail::createCPUGenerator(5);
    const at::Tensor k = at::randn({1, 4, 40, 8}, g), v = at::randn({1, 4, 40, 8}, g);
    for (int64_t t = 0; t < 30; ++t)
      for (auto* c : {drafted.get(), straight.get()}) c->update(0, k.narrow(2, t, 1), v.narrow(2, t, 1));
    for (int64_t t = 30; t < 34; ++t) drafted->update(0, k.narrow(2, t, 1), v.narrow(2, t, 1));  // 4 drafts
    drafted->truncate(3);                                                                       // 1 accepted
    straight->update(0, k.narrow(2, 30, 1), v.narrow(2, 30, 1));
    EXPECT_EQ(drafted->length(), straight->length());
    const auto a = drafted->update(0, k.narrow(2, 35, 1), v.narrow(2, 35, 1));
    const auto b = straight->update(0, k.narrow(2, 35, 1), v.narrow(2, 35, 1));
    EXPECT_TRUE(a.first.equal(b.first)) << (which ? "static" : "rolling") << ": the window after a rollback past it";
    EXPECT_TRUE(a.second.equal(b.second));
    EXPECT_EQ(a.first.size(2), cfg.context + 1);
  }
}

// A fork is a copy: the child's steps never reach the parent, whose logits stay those of a row
// that was never forked.
TEST_F(Serving, AForkedRowLeavesItsParentAlone) {
  RowBatch forked(*model, [this] { return std::make_unique<StaticKVCache>(cfg); }, DecodePath{});
  RowBatch plain(*model, [this] { return std::make_unique<StaticKVCache>(cfg); }, DecodePath{});
  at::Tensor lf, lp;
  const int64_t p = forked.add({{1, 2, 3}}, lf)[0], q = plain.add({{1, 2, 3}}, lp)[0];
  for (int i = 0; i < 5; ++i) lf = forked.step({p}, {7 + i}), lp = plain.step({q}, {7 + i});
  const int64_t child = forked.fork(p);
  EXPECT_EQ(forked.next_position(child), forked.next_position(p));
  for (int i = 0; i < 25; ++i) {
    const at::Tensor both = forked.step({p, child}, {20 + i, (40 + i) % 60});  // the child goes elsewhere
    lp = plain.step({q}, {20 + i});
    EXPECT_LT((both[0] - lp[0]).abs().max().item<double>(), 1e-5) << "step " << i;
  }
  // Rows leave and their slot is reused from a reset cache.
  forked.release(child);
  at::Tensor l2;
  const int64_t again = forked.add({{1, 2, 3}}, l2)[0];
  EXPECT_EQ(again, child) << "the freed slot is taken first";
  plain.add({{1, 2, 3}}, lp);
  EXPECT_LT((l2[0] - lp[0]).abs().max().item<double>(), 1e-5) << "the new row starts from nothing";
}

TEST_F(Serving, ACacheThatCannotForkSaysWhy) {
  RowBatch ring(*model, [this] { return std::make_unique<RingKVCache>(cfg); }, DecodePath{});
  EXPECT_NE(ring.unsupported().find("ring"), std::string::npos) << ring.unsupported();
  RowBatch rolling(*model, [this] { return std::make_unique<RollingKVCache>(cfg); }, DecodePath{});
  EXPECT_EQ(rolling.unsupported(), "");
  at::Tensor l;
  const int64_t r = rolling.add({{1, 2}}, l)[0];
  EXPECT_THROW(rolling.truncate(r, 3), std::invalid_argument) << "more tokens than the row has";
  EXPECT_THROW(rolling.step({r + 5}, {1}), std::invalid_argument) << "a row not in the batch";
}

// A prompt fed in chunks through extend (each at the row's next positions, seeing the row's entries)
// equals the prompt prefilled at once, on both cache kinds, and decoding goes on from it unchanged;
// a chunk that would end past the window is refused.
TEST_F(Serving, AChunkedPromptEqualsThePromptAtOnce) {
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  for (bool rolling : {true, false}) {
    SCOPED_TRACE(rolling ? "rolling" : "static");
    auto make = [this, rolling]() -> std::unique_ptr<KVCache> {
      if (rolling) return std::make_unique<RollingKVCache>(cfg);
      return std::make_unique<StaticKVCache>(cfg);
    };
    RowBatch whole(*model, make, DecodePath{}), chunked(*model, make, DecodePath{});
    at::Tensor a, b;
    const int64_t w = whole.add({prompt}, a)[0];
    const int64_t c = chunked.add({{1, 2, 3}}, b)[0];
    chunked.extend(c, {4});
    chunked.extend(c, {5, 6, 7, 8});
    b = chunked.extend(c, {9, 10, 11});
    EXPECT_EQ(chunked.next_position(c), 11);
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-5);
    const at::Tensor sa = whole.step({w}, {12}), sb = chunked.step({c}, {12});
    EXPECT_LT((sa - sb).abs().max().item<double>(), 1e-5) << "decoding goes on from the chunked prefill";
    EXPECT_THROW(chunked.extend(c, {1, 2, 3, 4, 5}), std::invalid_argument) << "positions 12..16 end past the 16-token window";
    EXPECT_THROW(chunked.extend(c, {}), std::invalid_argument);
  }
}

// Prefix reuse (a prompt cache): a prompt sharing a prefix with a released row takes its slot and
// keeps the shared entries; a prompt cached whole keeps all but its last token, which is computed
// again for its logits. Each equals the same prompt in a fresh batch; a row that left the window is
// not reused (its first entries are gone), nor is a live one.
TEST_F(Serving, APromptSharingAReleasedRowsPrefixReusesItsEntries) {
  for (bool rolling : {true, false}) {
    SCOPED_TRACE(rolling ? "rolling" : "static");
    auto make = [this, rolling]() -> std::unique_ptr<KVCache> {
      if (rolling) return std::make_unique<RollingKVCache>(cfg);
      return std::make_unique<StaticKVCache>(cfg);
    };
    RowBatch rows(*model, make, DecodePath{});
    auto fresh = [&](const std::vector<int64_t>& p) {
      RowBatch b(*model, make, DecodePath{});
      at::Tensor l;
      b.add({p}, l);
      return l[0];
    };
    at::Tensor l;
    const int64_t a = rows.add({{1, 2, 3, 4, 5, 6}}, l)[0];
    rows.step({a}, {7});
    rows.release(a);
    // Shares 4 tokens; and a miss beside it, prefilled from scratch.
    const auto got = rows.add({{1, 2, 3, 4, 9, 10}, {11, 12}}, l);
    EXPECT_EQ(got[0], a) << "the hit takes the released row's slot";
    EXPECT_EQ(rows.reused(), (std::vector<int64_t>{4, 0}));
    EXPECT_LT((l[0] - fresh({1, 2, 3, 4, 9, 10})).abs().max().item<double>(), 1e-5);
    EXPECT_LT((l[1] - fresh({11, 12})).abs().max().item<double>(), 1e-5);
    // Decoding on from a reused row equals decoding on from a fresh one.
    RowBatch other(*model, make, DecodePath{});
    at::Tensor lo;
    const int64_t o = other.add({{1, 2, 3, 4, 9, 10}}, lo)[0];
    EXPECT_LT((rows.step({got[0]}, {13}) - other.step({o}, {13})).abs().max().item<double>(), 1e-5);
    EXPECT_EQ(rows.next_position(got[0]), 7);
    // The whole prompt cached: all but its last token kept.
    rows.release(got[0]);
    rows.add({{1, 2, 3, 4, 9}}, l);
    EXPECT_EQ(rows.reused(), (std::vector<int64_t>{4}));
    EXPECT_LT((l[0] - fresh({1, 2, 3, 4, 9})).abs().max().item<double>(), 1e-5);
    // A row that went past the window keeps no first entries: nothing is reused from it.
    RowBatch past(*model, make, DecodePath{});
    const int64_t p = past.add({{1, 2, 3}}, l)[0];
    for (int i = 0; i < 20; ++i) past.step({p}, {5});
    past.release(p);
    past.add({{1, 2, 3, 5}}, l);
    EXPECT_EQ(past.reused(), (std::vector<int64_t>{0}));
  }
}

// A row's state as bytes: restored into another batch (or after the first is gone) it continues
// exactly as the saved row, inside the window and past it, where the cache keeps fewer entries
// than the row has tokens; bytes it did not write are refused.
TEST_F(Serving, ASavedRowRestoredAnywhereContinuesAsItWould) {
  for (bool rolling : {true, false}) {
    SCOPED_TRACE(rolling ? "rolling" : "static");
    auto make = [this, rolling]() -> std::unique_ptr<KVCache> {
      if (rolling) return std::make_unique<RollingKVCache>(cfg);
      return std::make_unique<StaticKVCache>(cfg);
    };
    for (int64_t steps : {int64_t{4}, 16 + kRollbackEntries + 9}) {  // inside the 16-token window, and past it
      RowBatch a(*model, make, DecodePath{});
      at::Tensor l;
      const int64_t r = a.add({{1, 2, 3}}, l)[0];
      for (int i = 0; i < steps; ++i) a.step({r}, {(5 + i) % 60});
      const std::string bytes = to_bytes(a.save(r));
      RowBatch b(*model, make, DecodePath{});
      b.add({{9, 9}}, l);  // the restored row lands in slot 1
      const int64_t q = b.restore(row_state_from_bytes(bytes));
      EXPECT_EQ(q, 1);
      EXPECT_EQ(b.next_position(q), a.next_position(r));
      for (int i = 0; i < 6; ++i) {
        const at::Tensor x = a.step({r}, {7 + i}), y = b.step({q}, {7 + i});
        EXPECT_EQ((x - y).abs().max().item<double>(), 0.0) << "steps " << steps << ", step " << i << " after the restore";
      }
    }
  }
  RowBatch a(*model, [this] { return std::make_unique<StaticKVCache>(cfg); }, DecodePath{});
  at::Tensor l;
  const std::string bytes = to_bytes(a.save(a.add({{1, 2, 3}}, l)[0]));
  EXPECT_THROW(row_state_from_bytes(bytes.substr(0, bytes.size() - 1)), std::invalid_argument) << "truncated";
  EXPECT_THROW(row_state_from_bytes("not a state"), std::invalid_argument);
  EXPECT_THROW(row_state_from_bytes(bytes + "x"), std::invalid_argument) << "trailing bytes";
  Config other = cfg;
  other.n_layers = 3;
  GPT bigger(other, 3);
  RowBatch c(*bigger, [other] { return std::make_unique<StaticKVCache>(other); }, DecodePath{});
  EXPECT_THROW(c.restore(row_state_from_bytes(bytes)), std::invalid_argument) << "a state of another model";
  RowBatch ring(*model, [this] { return std::make_unique<RingKVCache>(cfg); }, DecodePath{});
  EXPECT_NE(RingKVCache(cfg).save_unsupported(), "");
}


// A context shift: the kept later keys are re-rotated (a shift that skips it gives other logits, and
// so does one that leaves the position where it was); a span outside the row is refused; the kept
// later entries are never served as a later prompt's prefix.
TEST_F(Serving, AContextShiftReRotatesTheKeysItKeeps) {
  struct NoRotation final : ServingSchedule {
    int64_t shift_rotation(int64_t) const override { return 0; }
  } no_rotation;
  for (bool rolling : {true, false}) {
    SCOPED_TRACE(rolling ? "rolling" : "static");
    auto make = [this, rolling]() -> std::unique_ptr<KVCache> {
      if (rolling) return std::make_unique<RollingKVCache>(cfg);
      return std::make_unique<StaticKVCache>(cfg);
    };
    auto run = [&](const ServingSchedule& sched, bool shift) {
      RowBatch b(*model, make, DecodePath{}, sched);
      at::Tensor l;
      const int64_t r = b.add({{1, 2, 3, 4, 5, 6}}, l)[0];
      for (int i = 0; i < 10; ++i) b.step({r}, {(7 + 3 * i) % 60});  // 16 tokens: the window full
      if (shift) {
        b.shift(r, 2, 7);
        EXPECT_EQ(b.next_position(r), 9);
      }
      return b.step({r}, {11});  // (1, V)
    };
    const at::Tensor shifted = run(production_serving(), true), unrotated = run(no_rotation, true), plain = run(production_serving(), false);
    // Untrained weights attend nearly evenly, so a wrong rotation moves the logits little (2.8e-4
    // here), but never by nothing: both runs are the same operations but for the rotation.
    EXPECT_GT((shifted - unrotated).abs().max().item<double>(), 1e-5) << "the rotation of the kept keys matters";
    EXPECT_GT((shifted - plain).abs().max().item<double>(), 1e-5) << "the shift dropped entries";
    RowBatch b(*model, make, DecodePath{});
    at::Tensor l;
    const int64_t r = b.add({{1, 2, 3, 4, 5, 6}}, l)[0];
    EXPECT_THROW(b.shift(r, 4, 3), std::invalid_argument) << "past the row's end";
    EXPECT_THROW(b.shift(r, 1, 0), std::invalid_argument) << "nothing to drop";
    b.shift(r, 2, 2);
    b.release(r);
    b.add({{1, 2, 5, 6, 9}}, l);
    EXPECT_EQ(b.reused()[0], 2) << "only the entries before the shift are a cold run's";
  }
}

}  // namespace
}  // namespace tinygpt
