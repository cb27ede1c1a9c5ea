// The model check table: the rows in the order they run. Each row is defined in its own file of this
// folder (or with its family: model_rows.cpp, serving_rows.cpp) - its run function, the constants it
// runs with and its CheckDef, whose prose is built from those constants - and listed here. Everything
// else is derived from these rows - the default set, `--checks` and its help, conform's selection, the
// rows a declared deviation touches, the fault matrix's columns, the kit's test cases, docs/checks.md's
// tables (`tinygpt checks --markdown`).
#include <set>
#include <stdexcept>

#include "rows.h"

namespace tinygpt::checks {

// model_rows.cpp
CheckDef tokens_def();
CheckDef logits_def();
CheckDef window_reference_def();
CheckDef reset_def();
CheckDef teacher_forced_def();
CheckDef sampled_def();
CheckDef long_prompt_def();
CheckDef batch_def();
CheckDef self_def();
// serving_rows.cpp
CheckDef ragged_def();
CheckDef join_leave_def();
CheckDef fork_def();
CheckDef rollback_def();
CheckDef batch_sizes_def();
CheckDef shared_prefix_def();
// chunked_prefill.cpp
CheckDef chunked_prefill_def();
// thread_counts.cpp
CheckDef thread_counts_def();
// prefix_reuse.cpp
CheckDef prefix_reuse_def();
// churn.cpp
CheckDef churn_def();
// save_restore.cpp
CheckDef save_restore_def();
// rollback_after_restore.cpp
CheckDef rollback_after_restore_def();
// context_shift.cpp
CheckDef context_shift_def();
// reuse_after_shift.cpp, reuse_past_window.cpp
CheckDef reuse_after_shift_def();
CheckDef reuse_past_window_def();
// served.cpp
CheckDef served_def();
// speculative.cpp
CheckDef spec_greedy_def();
CheckDef spec_seeded_def();
CheckDef spec_stops_def();
CheckDef spec_cache_def();
CheckDef spec_distribution_def();

namespace {

std::vector<CheckDef> make_table() {
  std::vector<CheckDef> t = {
      tokens_def(),
      logits_def(),
      window_reference_def(),
      reset_def(),
      teacher_forced_def(),
      sampled_def(),
      long_prompt_def(),
      batch_def(),
      self_def(),
      ragged_def(),
      join_leave_def(),
      fork_def(),
      rollback_def(),
      batch_sizes_def(),
      chunked_prefill_def(),
      thread_counts_def(),
      prefix_reuse_def(),
      shared_prefix_def(),
      churn_def(),
      save_restore_def(),
      rollback_after_restore_def(),
      context_shift_def(),
      reuse_after_shift_def(),
      reuse_past_window_def(),
      served_def(),
      spec_greedy_def(),
      spec_seeded_def(),
      spec_stops_def(),
      spec_cache_def(),
      spec_distribution_def(),
  };
  std::set<std::string> names;
  for (const auto& c : t) {
    if (!names.insert(c.name).second) throw std::logic_error("check table: duplicate name " + c.name);
    if (c.proves.empty() || c.catches.empty() || !c.run) throw std::logic_error("check table: row " + c.name + " is incomplete");
  }
  return t;
}

}  // namespace

const std::vector<CheckDef>& model_checks() {
  static const std::vector<CheckDef> table = make_table();
  return table;
}

}  // namespace tinygpt::checks
