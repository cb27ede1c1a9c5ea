// The tinygpt command line. Library code throws; what reaches main becomes one line on stderr and
// an exit code (0 ok, 1 a check failed, 2 bad input: an argument or a file the user gave, 3 runtime
// error). The commands that drive an engine catch EngineUnusable themselves, to print what they
// have before exiting 2.
#include <CLI/CLI.hpp>
#include <iostream>
#include <stdexcept>

#include "cli_common.h"
#include "commands.h"
#include "runtime.h"
#include "tinygpt/blas.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/device.h"
#include "tinygpt/errors.h"
#include "tinygpt/kernels.h"

namespace {
// What this tinygpt is and what it runs on: the build, LibTorch, the BLAS core, the decode kernels.
std::string version() {
  const tinygpt::CpuFeatures cpu = tinygpt::cpu_features();
  return std::string("tinygpt-verify ") + TINYGPT_VERSION + " (commit " + tinygpt::checks::git_commit() + ")\n" +
         "LibTorch " + tinygpt::libtorch_version() + "; BLAS: " + tinygpt::blas_info().to_string() + "\n" +
         "decode kernels: " + tinygpt::to_string(tinygpt::kernel_path()) + "; CPU: " + tinygpt::cpu_model() + " (" + cpu.to_string() + ")";
}
}  // namespace

int main(int argc, char** argv) {
  using namespace tinygpt::cli;
  prepare_process(argc, argv);  // may re-execute this program once with the environment it needs (runtime.h)
  CLI::App app{
      "tinygpt - the series' 5.8M-parameter GPT in C++/LibTorch, and the harness that proves its\n"
      "KV cache and sampler right. Run `tinygpt <command> --help` for a command's options."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show every command's options");
  register_commands(app);
  try {
    app.set_version_flag("--version", version, "The version, and the LibTorch, BLAS core and decode kernels it runs on");
    tinygpt::kernel_path();  // TINYGPT_KERNELS names a path this CPU cannot run: one line, exit 2
    app.parse(argc, argv);
    return run_selected(app);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // One line, as for every other bad input (CLI11 would add "Run with --help ...").
    std::cerr << "tinygpt: error: " << e.what() << " (see --help)\n";
    return kBadInput;
  } catch (const std::invalid_argument& e) {
    std::cerr << "tinygpt: error: " << e.what() << "\n";
    return kBadInput;
  } catch (const tinygpt::InputError& e) {  // a file the user named is not what it claims
    std::cerr << "tinygpt: error: " << e.what() << "\n";
    return kBadInput;
  } catch (const std::exception& e) {
    // LibTorch's c10::Error carries a multi-line backtrace; the first line says what happened.
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    std::cerr << "tinygpt: error: " << msg << "\n";
    return kRuntimeError;
  }
}
