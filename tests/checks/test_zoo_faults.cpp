// The zoo's boundary faults (checks/src/faults/zoo.cpp): each is caught by every row it names on
// every member with its feature, and passes every one of those rows on every member without it - the
// feature predicate is what the fault matrix of `verify --model zoo:NAME` trusts. Members shrunk to a
// 64-token context (windows 16, original RoPE contexts 16) so every boundary is crossed in 88 tokens.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "tinygpt/checks/cache_registry.h"
#include "tinygpt/checks/check_names.h"
#include "tinygpt/checks/check_suite.h"
#include "tinygpt/checks/target.h"
#include "tinygpt/gpt.h"
#include "tinygpt/zoo.h"

namespace tinygpt::checks {
namespace {

Config shrunk(Config c) {
  c.vocab_size = 256;
  c.context = 64;
  if (c.has_sliding()) c.sliding_window = 16;
  if (c.rope_scaling.original_context > 0) c.rope_scaling.original_context = 16;
  c.validate();
  return c;
}

// Random weights sharpened (scores and logits of order 1), as the unit tests' members.
GPT sharp(const Config& c) {
  GPT m(c, 5);
  m->eval();
  at::NoGradGuard ng;
  for (const auto& item : m->named_parameters())
    if (item.key().find("norm") == std::string::npos) item.value().mul_(4.0);
  return m;
}

TEST(ZooFaults, EachCaughtWhereItsFeatureIsAndNowhereElse) {
  const auto faults = cache_registry().zoo_faults();
  ASSERT_GE(faults.size(), 10u);
  const auto seed_faults = cache_registry().all(/*faults=*/true);
  for (const auto* f : faults)
    EXPECT_EQ(std::find(seed_faults.begin(), seed_faults.end(), f), seed_faults.end()) << f->name << " is kept out of the seed's fault list";
  std::map<std::string, int> caught_on;
  for (const auto& member : zoo_names()) {
    const Config cfg = shrunk(zoo_config(member));
    GPT model = sharp(cfg);
    EquivalenceOptions opts;
    opts.prompt = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
    opts.tokens = cfg.context + 24;
    const Reference ref = build_reference(model, opts);
    for (const auto* f : faults) {
      const bool has = f->applies(cfg);
      ModelTarget target(model, *f);
      const auto r = run_checks(model, opts, target, f->expected, &ref);
      ASSERT_EQ(r.checks.size(), f->expected.size()) << f->name << " on " << member;
      for (const auto& c : r.checks) {
        if (has) {
          EXPECT_EQ(c.status, Status::Fail) << f->name << " on " << member << ": " << c.name << " must catch it; " << c.detail;
        } else {
          EXPECT_EQ(c.status, Status::Pass) << f->name << " on " << member << " (no " << f->feature << "): " << c.name
                                                 << " must pass; " << c.detail;
        }
      }
      if (has) ++caught_on[f->name];
    }
  }
  for (const auto* f : faults) EXPECT_GE(caught_on[f->name], 1) << f->name << " applies to no member: a blind spot of the zoo";
}

TEST(ZooFaults, TheSeedsArchitectureHasNoneOfTheFeatures) {
  for (const auto* f : cache_registry().zoo_faults()) EXPECT_FALSE(f->applies(Config{})) << f->name;
}

}  // namespace
}  // namespace tinygpt::checks
