#include "commands.h"

namespace tinygpt::cli {

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace

void register_commands(CLI::App& app) {
  registry() = {add_generate(app),  add_equivalence(app),       add_inject(app), add_convert(app), add_export(app),
                add_encode(app),    add_decode(app), add_train_tokenizer(app), add_train(app),
                add_sample_grid(app), add_golden(app), add_verify(app), add_bench(app), add_cross_device(app),
                add_conform(app), add_compare(app), add_checks(app)};
}

int run_selected(CLI::App& app) {
  for (auto& c : registry())
    if (c.app->parsed()) return c.run();
  return 2;
}

}  // namespace tinygpt::cli
