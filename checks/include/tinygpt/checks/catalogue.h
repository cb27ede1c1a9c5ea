// The check table, the faults and the deviations as documents: what `tinygpt checks` prints, and
// the tables docs/checks.md holds between its "generated" markers (a test keeps them equal).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace tinygpt::checks {

// {checks: [{name, proves, catches, judged_by, tags, cost, operation}], sampler: [{name, states,
//  needs_scores}], faults: [{name, models, expected, runs}], deviations: [{name, what, touches,
//  tolerance, self_tolerance, evidence}]}
nlohmann::json catalogue_json();
// The same as Markdown tables: the model checks, the faults, the deviations, the sampler rows.
std::string catalogue_markdown();
// A short console listing: one line per model check, fault and deviation.
std::string catalogue_text();

}  // namespace tinygpt::checks
