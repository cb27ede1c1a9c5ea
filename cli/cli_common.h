// Pieces every tinygpt subcommand shares: device/thread options and argument parsing helpers.
// Parsing helpers throw std::invalid_argument with the option's name; main() maps that to exit 2.
#pragma once

#include <ATen/core/Tensor.h>
#include <CLI/CLI.hpp>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tinygpt {
class Tokenizer;
}

namespace tinygpt::cli {

// Exit codes: the verdict reaches CI through these.
enum Exit : int { kOk = 0, kCheckFailed = 1, kBadInput = 2, kRuntimeError = 3 };

struct RunOptions {
  std::string device = "cpu";
  int threads = 0;  // 0 = the cores available
};

// Option checks with one readable message: a number > 0, a number >= 0, a share in (0, 1].
extern const CLI::Validator kPositive;
extern const CLI::Validator kNonNegative;
extern const CLI::Validator kShare;

// --html FILE, --markdown FILE (and --bench-json FILE where the report can carry a bench): the
// human views of a command's report.
struct ReportFiles {
  std::string html, markdown, bench_json;
  void add(CLI::App* cmd, bool bench);
  bool any() const { return !html.empty() || !markdown.empty(); }
};

// Adds --device and --threads to a subcommand.
void add_run_options(CLI::App* cmd, RunOptions& opts);
// Applies --threads and resolves --device (clear error if CUDA is missing).
c10::Device apply_run_options(const RunOptions& opts);

// "1,2,3" -> {1, 2, 3}; rejects empty items, non-integers and ids outside [0, vocab).
std::vector<int64_t> parse_ids(const std::string& text, int64_t vocab, const std::string& option);
// The prompt: `prompt` encoded by `tok` when `prompt` is non-empty (it then needs `tok`), else
// `ids` parsed. A given tokenizer must match the model's vocabulary (the series' exactly; a Hugging
// Face tokenizer.json may have fewer ids than a model whose embedding is padded).
std::vector<int64_t> prompt_ids(const std::string& ids, const std::string& prompt, const Tokenizer* tok,
                                int64_t vocab);
// The tokenizer to read: `given` (--tokenizer), or else the tokenizer.json in the --checkpoint
// directory where there is one (a Hugging Face directory's own), or else "".
std::string tokenizer_for(const std::string& given, const std::string& checkpoint);
// The --tokenizer option's help where --prompt uses it (tokenizer_for's default said).
extern const char* const kTokenizerHelp;
// ids repeated over `batch` rows: (batch, n) int64 on `device`.
at::Tensor ids_tensor(const std::vector<int64_t>& ids, int64_t batch, c10::Device device);
// One row of ids as "a,b,c".
std::string join_ids(const at::Tensor& row);
std::string join_ids(const std::vector<int64_t>& ids);

}  // namespace tinygpt::cli
