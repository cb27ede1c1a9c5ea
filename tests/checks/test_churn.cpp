// churn as a RapidCheck state machine (rc::state): the operations of churn.h generated from the
// run's shape, each one's logits judged against our reference over that row's own sequence as it
// runs. Our caches pass; a planted serving fault fails, and RapidCheck shrinks the failure to a short
// script of operations that replays it. And the seeded `churn` row: its plan is the same every time,
// and it catches the faults it names.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_names.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/churn.h"
#include "tinygpt/checks/target.h"
#include "small_model.h"

namespace tinygpt::checks {
namespace {

// The system under test: a churn run on one cache variant of our model, judged as it goes.
struct Sut {
  Sut(GPT m, const CacheVariant& v, const ChurnOps& ops) : model(std::move(m)), target(model, v), run(target, model, 6, ops) {}
  GPT model;
  ModelTarget target;
  ChurnRun run;
};

struct Op final : rc::state::Command<ChurnShape, Sut> {
  explicit Op(ChurnOp o) : op(std::move(o)) {}
  ChurnOp op;
  void checkPreconditions(const ChurnShape& s) const override { RC_PRE(s.applicable(op)); }
  void apply(ChurnShape& s) const override { s.apply(op); }
  void run(const ChurnShape&, Sut& sut) const override {
    sut.run.apply(op);
    for (int64_t k : sut.run.touched()) {
      const ChurnVerdict v = churn_verdict(sut.model, sut.run.rows()[k], Tolerances{});
      RC_ASSERT(v.ok);  // row k parted from its sequence alone when not
    }
  }
  void show(std::ostream& os) const override { os << to_string(op); }
};

// One operation that may apply to `s` (RapidCheck discards and draws again when it does not).
rc::Gen<std::shared_ptr<const rc::state::Command<ChurnShape, Sut>>> next_op(const ChurnShape& s) {
  return rc::gen::exec([s] {
    const std::vector<int64_t> live = s.live_rows();
    ChurnOp op;
    // Every kind at every size (RapidCheck's ranges grow with the size: small cases would draw
    // only the first kinds).
    op.kind = live.empty() ? ChurnOp::Kind::Admit : static_cast<ChurnOp::Kind>(*rc::gen::resize(100, rc::gen::inRange(0, ChurnOp::kKinds)));
    switch (op.kind) {
      case ChurnOp::Kind::Admit: op.n = *rc::gen::inRange<int64_t>(1, s.context + 1); break;
      case ChurnOp::Kind::Restore: op.n = *rc::gen::inRange<int64_t>(0, std::max<int64_t>(1, static_cast<int64_t>(s.saved.size()))); break;
      case ChurnOp::Kind::Shift:
        op.rows = {*rc::gen::elementOf(live)};
        op.keep = *rc::gen::inRange<int64_t>(0, 5);
        op.n = *rc::gen::inRange<int64_t>(1, std::max<int64_t>(2, s.rows[static_cast<size_t>(op.rows[0])].next));
        break;
      case ChurnOp::Kind::Step:
        for (int64_t k : live)
          if (*rc::gen::arbitrary<bool>()) op.rows.push_back(k);
        if (op.rows.empty()) op.rows.push_back(*rc::gen::elementOf(live));
        op.n = *rc::gen::inRange<int64_t>(1, 17);
        break;
      default:
        op.rows = {*rc::gen::elementOf(live)};
        op.n = op.kind == ChurnOp::Kind::Truncate ? *rc::gen::inRange<int64_t>(1, 7)
               : op.kind == ChurnOp::Kind::Extend ? *rc::gen::inRange<int64_t>(1, 13)
                                                  : 1;
    }
    return std::shared_ptr<const rc::state::Command<ChurnShape, Sut>>(std::make_shared<Op>(op));
  });
}

// Keeps RapidCheck's own report out of the log: an expected failure must not look like a real one.
class Silent : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

// The operations the variant's rows have (a cache that cannot give its entries has no save or shift).
ChurnOps ops_of(GPT& model, const CacheVariant& v) { return churn_ops_of(ModelTarget(model, v)); }

rc::detail::TestResult churn_property(GPT& model, const CacheVariant& v, int cases) {
  rc::detail::TestParams params;
  params.seed = 20261201;
  params.maxSuccess = cases;
  params.maxSize = 60;  // operations per case, at most
  Silent silent;
  ChurnShape start;
  start.context = model->config().context;
  start.max_live = 6;
  start.ops = ops_of(model, v);
  return rc::detail::checkTestable(
      [&] {
        Sut sut(model, v, start.ops);
        rc::state::check(start, sut, next_op);
      },
      rc::detail::TestMetadata{"churn/" + v.name, "churn"}, params, silent);
}

// The operations of a shrunk counterexample, one per line (RapidCheck shows the command sequence).
std::vector<std::string> script_of(const rc::detail::FailureResult& f) {
  std::vector<std::string> ops;
  for (const auto& shown : f.counterExample) {
    std::istringstream lines(shown.second);
    for (std::string line; std::getline(lines, line);) {
      const auto a = line.find_first_not_of(" \t[],");
      if (a == std::string::npos) continue;
      line = line.substr(a);
      while (!line.empty() && (line.back() == ',' || line.back() == ']' || line.back() == ' ')) line.pop_back();
      if (!line.empty()) ops.push_back(line);
    }
  }
  return ops;
}

class Churn : public ::testing::Test {
 protected:
  void SetUp() override { model->eval(); }
  GPT model{small_config(), 11};
};

TEST_F(Churn, OurCachesHoldTheStateMachineProperty) {
  for (const char* name : {"rolling", "static"}) {
    const auto result = churn_property(model, cache_registry().get(name), 12);
    std::ostringstream why;
    rc::detail::printResultMessage(result, why);
    EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << name << ": " << why.str();
  }
}

// Each planted serving fault fails the property, and the failure shrinks to a few operations; the
// shrunk script replays it: run again by hand through ChurnRun, it fails the same way (wrong
// logits, or an operation the target refuses: a state saved in part cannot be shifted either).
TEST_F(Churn, APlantedFaultShrinksToAShortScriptThatReplays) {
  for (const char* fault : {"position-by-request", "released-slot-not-reset", "fork-shares-storage", "shift-keys-not-rotated", "state-saved-in-part"}) {
    const CacheVariant& v = cache_registry().get(fault);
    const auto result = churn_property(model, v, 40);
    std::ostringstream why;
    rc::detail::printResultMessage(result, why);
    ASSERT_TRUE(result.template is<rc::detail::FailureResult>()) << fault << " passed the churn property: " << why.str();
    const std::vector<std::string> script = script_of(result.template get<rc::detail::FailureResult>());
    std::string shown;
    for (const auto& s : script) shown += "  " + s + "\n";
    std::cout << fault << ": shrunk to " << script.size() << " operations:\n" << shown;
    EXPECT_LE(script.size(), 8u) << fault << ":\n" << shown;
    // Replay: parse each line back into an operation and run it.
    ModelTarget target(model, v);
    ChurnRun run(target, model, 6, ops_of(model, v));
    bool parted = false;
    std::string followed;  // the operation the first divergence followed, as a diagnosis reads it
    for (const std::string& line : script) {
      std::istringstream in(line);
      std::string kind;
      in >> kind;
      ChurnOp op;
      if (kind == "admit") {
        op.kind = ChurnOp::Kind::Admit;
        in >> op.n;
      } else if (kind == "step") {
        op.kind = ChurnOp::Kind::Step;
        std::string rows, times;
        in >> rows >> times;
        std::istringstream rs(rows);
        for (std::string r; std::getline(rs, r, ',');) op.rows.push_back(std::stoll(r));
        op.n = std::stoll(times.substr(1));
      } else if (kind == "restore") {
        op.kind = ChurnOp::Kind::Restore;
        in >> op.n;
      } else if (kind == "shift") {
        op.kind = ChurnOp::Kind::Shift;
        std::string row, word;
        in >> row >> word >> op.keep >> word >> op.n;
        op.rows = {std::stoll(row)};
      } else {
        std::string row, by;
        in >> row;
        op.rows = {std::stoll(row)};
        op.kind = kind == "fork" ? ChurnOp::Kind::Fork : kind == "release" ? ChurnOp::Kind::Release
                  : kind == "truncate"                 ? ChurnOp::Kind::Truncate
                  : kind == "save"                     ? ChurnOp::Kind::Save
                                                       : ChurnOp::Kind::Extend;
        if (in >> by >> op.n) {
        } else {
          op.n = 1;
        }
      }
      EXPECT_EQ(to_string(op), line) << "the script's lines are to_string's";
      ASSERT_TRUE(run.shape().applicable(op)) << fault << ": '" << line << "' does not apply on replay";
      try {
        run.apply(op);
      } catch (const std::exception& e) {  // the target refused an operation the contract defines: a failure too
        parted = true;
        break;
      }
      for (int64_t k : run.touched()) {
        const ChurnVerdict cv = churn_verdict(model, run.rows()[k], Tolerances{});
        if (!cv.ok && !parted) followed = churn_signature(run.script(), run.rows()[k], cv).kinds_text();
        parted = parted || !cv.ok;
      }
      if (parted) break;
    }
    EXPECT_TRUE(parted) << fault << ": the shrunk script did not fail on replay:\n" << shown;
    // The shrunk script names the operation the bug is about (diagnose.h matches churn by it); a loop
    // bug in every step's positions follows whatever came last, and a refusal names none.
    const std::map<std::string, std::string> about = {
        {"released-slot-not-reset", "release + admit"}, {"fork-shares-storage", "fork"}, {"shift-keys-not-rotated", "shift"}};
    if (about.count(fault)) {
      EXPECT_FALSE(followed.empty()) << fault << ": parted without wrong logits:\n" << shown;
      EXPECT_NE(followed.find(about.at(fault)), std::string::npos) << fault << ": the divergence followed " << followed << ":\n" << shown;
    }
  }
}

// The row's plan is a function of its seed: the same operations every run, each applicable in turn.
TEST(ChurnPlan, IsTheSameEveryTimeAndEveryOperationApplies) {
  const ChurnOps all;
  const auto a = churn_plan(kChurnSeed, kChurnOps, 256, kChurnLive, all);
  const auto b = churn_plan(kChurnSeed, kChurnOps, 256, kChurnLive, all);
  ASSERT_EQ(a.size(), static_cast<size_t>(kChurnOps));
  ChurnShape s;
  s.context = 256;
  s.max_live = kChurnLive;
  int64_t kinds[ChurnOp::kKinds] = {}, past = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(to_string(a[i]), to_string(b[i]));
    ASSERT_TRUE(s.applicable(a[i])) << i << ": " << to_string(a[i]);
    s.apply(a[i]);
    ++kinds[static_cast<int>(a[i].kind)];
  }
  for (const auto& row : s.rows) past += row.next > 256;
  for (int k = 0; k < ChurnOp::kKinds; ++k) EXPECT_GT(kinds[k], 0) << "operation kind " << k << " never drawn";
  EXPECT_GT(past, 0) << "no row went past the window";
  EXPECT_NE(to_string(churn_plan(kChurnSeed + 1, kChurnOps, 256, kChurnLive, all)[5]) + to_string(churn_plan(kChurnSeed + 1, kChurnOps, 256, kChurnLive, all)[9]),
            to_string(a[5]) + to_string(a[9]));
  // Without the operations a target lacks, none of them is drawn; inside the window, no row leaves it.
  ChurnOps few;
  few.offered = Ops{};
  few.past_window = false;
  ChurnShape t;
  t.context = 256;
  t.max_live = kChurnLive;
  t.ops = few;
  for (const auto& op : churn_plan(kChurnSeed, kChurnOps, 256, kChurnLive, few)) {
    EXPECT_TRUE(op.kind == ChurnOp::Kind::Admit || op.kind == ChurnOp::Kind::Step || op.kind == ChurnOp::Kind::Release) << to_string(op);
    ASSERT_TRUE(t.applicable(op)) << to_string(op);
    t.apply(op);
  }
  for (const auto& row : t.rows) EXPECT_LE(row.next, 256);
}

// The rules the shape enforces are the serving contract's.
TEST(ChurnShape, RefusesWhatTheContractDoesNotDefine) {
  ChurnShape s;
  s.context = 32;
  s.max_live = 2;
  EXPECT_FALSE(s.applicable({ChurnOp::Kind::Admit, {}, 33})) << "a prompt longer than the window";
  EXPECT_FALSE(s.applicable({ChurnOp::Kind::Step, {0}, 1})) << "no such row";
  s.apply({ChurnOp::Kind::Admit, {}, 30});
  EXPECT_FALSE(s.applicable({ChurnOp::Kind::Extend, {0}, 3})) << "a chunk that ends past the window";
  EXPECT_TRUE(s.applicable({ChurnOp::Kind::Extend, {0}, 2}));
  EXPECT_FALSE(s.applicable({ChurnOp::Kind::Step, {0, 0}, 1})) << "a row twice in one step";
  EXPECT_FALSE(s.applicable({ChurnOp::Kind::Truncate, {0}, 30})) << "a rollback of the whole row";
  s.apply({ChurnOp::Kind::Step, {0}, 32 + kRollbackEntries + 8});  // 8 entries gone for good
  EXPECT_TRUE(s.applicable({ChurnOp::Kind::Truncate, {0}, kRollbackEntries}));
  EXPECT_FALSE(s.applicable({ChurnOp::Kind::Truncate, {0}, kRollbackEntries + 1})) << "a rollback past the entries kept for it";
  s.apply({ChurnOp::Kind::Fork, {0}, 1});
  EXPECT_FALSE(s.applicable({ChurnOp::Kind::Admit, {}, 1})) << "more than max_live rows";
  s.apply({ChurnOp::Kind::Release, {0}, 1});
  EXPECT_FALSE(s.applicable({ChurnOp::Kind::Step, {0}, 1})) << "a released row";
  EXPECT_TRUE(s.applicable({ChurnOp::Kind::Step, {1}, 1}));
}

// A context shift needs a row whose cache holds every entry of it, and leaves a later entry to
// re-rotate; a shifted row stays inside the window; a restore needs a state saved before.
TEST(ChurnShape, ShiftsAndRestoresOnlyWhereTheyAreDefined) {
  using K = ChurnOp::Kind;
  ChurnShape s;
  s.context = 32;
  s.max_live = 3;
  EXPECT_FALSE(s.applicable({K::Restore, {}, 0})) << "nothing saved yet";
  s.apply({K::Admit, {}, 30});
  EXPECT_FALSE(s.applicable({K::Shift, {0}, 26, 4})) << "a shift that keeps no later entry";
  EXPECT_FALSE(s.applicable({K::Shift, {0}, 0, 4})) << "a shift that drops nothing";
  EXPECT_TRUE(s.applicable({K::Shift, {0}, 25, 4}));
  s.apply({K::Save, {0}, 1});
  s.apply({K::Shift, {0}, 20, 4});
  EXPECT_EQ(s.rows[0].next, 10);
  EXPECT_FALSE(s.applicable({K::Step, {0}, 23})) << "a shifted row past the window";
  EXPECT_TRUE(s.applicable({K::Step, {0}, 22}));
  EXPECT_TRUE(s.applicable({K::Restore, {}, 0}));
  EXPECT_FALSE(s.applicable({K::Restore, {}, 1})) << "one state saved, not two";
  s.apply({K::Restore, {}, 0});
  EXPECT_EQ(s.rows[1].next, 30) << "the restored row is the row as it was saved";
  EXPECT_FALSE(s.rows[1].shifted);
  s.apply({K::Step, {1}, 3});
  EXPECT_FALSE(s.applicable({K::Shift, {1}, 2, 4})) << "a row past the window";
}

// The seeded row on our caches and on the faults it names.
TEST_F(Churn, TheRowPassesOurCachesAndFailsPositionByRequest) {
  EquivalenceOptions o;
  o.prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  o.tokens = 80;
  for (const char* name : {"rolling", "static"}) {
    ModelTarget t(model, cache_registry().get(name));
    const auto r = run_checks(model, o, t, {check::kChurn});
    EXPECT_EQ(r.checks[0].status, Status::Pass) << name << ": " << r.checks[0].detail;
    EXPECT_NE(r.checks[0].detail.find("200 operations"), std::string::npos) << r.checks[0].detail;
  }
  ModelTarget bad(model, cache_registry().get("position-by-request"));
  const auto r = run_checks(model, o, bad, {check::kChurn});
  EXPECT_EQ(r.checks[0].status, Status::Fail) << r.checks[0].detail;
  EXPECT_NE(r.checks[0].detail.find("shown by operation"), std::string::npos) << r.checks[0].detail;
}

}  // namespace
}  // namespace tinygpt::checks
