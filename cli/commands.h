// Subcommand registry: each command file adds its CLI11 subcommand and the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <vector>

#include "tinygpt/sampler.h"

namespace tinygpt::cli {

struct Command {
  CLI::App* app;
  std::function<int()> run;  // returns the exit code
};

// Adds every subcommand to `app`.
void register_commands(CLI::App& app);
// Runs whichever subcommand was parsed.
int run_selected(CLI::App& app);

// Each command file defines one of these; its run function owns the command's option storage
// (shared with the parser).
Command add_generate(CLI::App& app);
// --temperature --top-k --top-p --penalty --seed, shared by generate and sample-grid.
void add_sampling_options(CLI::App* cmd, SamplingSettings& s, uint64_t& seed);
Command add_equivalence(CLI::App& app);
Command add_inject(CLI::App& app);
Command add_checks(CLI::App& app);
Command add_convert(CLI::App& app);
Command add_export(CLI::App& app);
Command add_encode(CLI::App& app);
Command add_decode(CLI::App& app);
Command add_train_tokenizer(CLI::App& app);
Command add_train(CLI::App& app);
Command add_sample_grid(CLI::App& app);
Command add_golden(CLI::App& app);
Command add_verify(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_cross_device(CLI::App& app);
Command add_conform(CLI::App& app);
Command add_compare(CLI::App& app);

}  // namespace tinygpt::cli
