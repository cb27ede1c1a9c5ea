// The suite proves it can fail: every planted sampler bug must break at least one law or fixed
// check. Prints the detection report (bug x caught-by) to stdout.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <iostream>
#include <sstream>

#include "tinygpt/laws/sampler_laws.h"

namespace tinygpt::props {
namespace {

// Swallows RapidCheck's per-case events: an expected failure should not look like a real one.
class Silent : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

TEST(PlantedBugs, EveryPlantedBugIsCaught) {
  const c10::Device cpu(c10::kCPU);
  std::ostringstream report;
  report << "planted bug -> caught by\n";
  int caught_bugs = 0;
  const auto bugs = planted_bugs();
  for (const auto& bug : bugs) {
    std::vector<std::string> caught_by;
    for (const auto& law : generated_laws()) {
      rc::detail::TestParams params;
      params.seed = 20261129;
      params.maxSuccess = 100;
      params.disableShrinking = true;
      Silent silent;
      const auto result = rc::detail::checkTestable([&] { law.body(bug, cpu); },
                                                    rc::detail::TestMetadata{bug.name + "/" + law.name, law.name},
                                                    params, silent);
      if (result.template is<rc::detail::FailureResult>()) caught_by.push_back(law.name);
    }
    for (const auto& check : fixed_checks()) {
      std::string verdict;
      try {
        verdict = check.run(bug, cpu);
      } catch (const std::exception& e) {
        verdict = "threw";  // e.g. every token filtered away: multinomial refuses. Also a catch.
      }
      if (!verdict.empty()) caught_by.push_back(check.name + (verdict == "threw" ? " (threw)" : ""));
    }
    report << "  " << bug.name << " (" << bug.description << "): ";
    if (caught_by.empty()) report << "MISSED";
    for (size_t i = 0; i < caught_by.size(); ++i) report << (i ? ", " : "") << caught_by[i];
    report << "\n";
    caught_bugs += caught_by.empty() ? 0 : 1;
    EXPECT_FALSE(caught_by.empty()) << bug.name << " was caught by no law";
  }
  report << "caught " << caught_bugs << " of " << bugs.size() << " planted bugs\n";
  std::cout << report.str();
  EXPECT_GE(bugs.size(), 4u);
}

// The negative control: the production sampler breaks no law under the same parameters.
TEST(PlantedBugs, ProductionSamplerPassesTheSameRun) {
  const c10::Device cpu(c10::kCPU);
  for (const auto& law : generated_laws()) {
    rc::detail::TestParams params;
    params.seed = 20261129;
    params.maxSuccess = 100;
    Silent silent;
    const auto result = rc::detail::checkTestable([&] { law.body(production_sampler(), cpu); },
                                                  rc::detail::TestMetadata{law.name, law.name}, params, silent);
    EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << law.name;
  }
}

}  // namespace
}  // namespace tinygpt::props
