#include "cli_common.h"

#include <cmath>
#include <filesystem>

#include <ATen/ATen.h>
#include <sstream>
#include <stdexcept>

#include "tinygpt/device.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::cli {

namespace {
// A finite number for which `ok` holds, else "must be WHAT (got 'V')".
CLI::Validator number_check(bool (*ok)(double), const std::string& what, const std::string& name) {
  return CLI::Validator(
      [ok, what](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && std::isfinite(x) && ok(x)) return "";
        } catch (const std::exception&) {
        }
        return "must be " + what + " (got '" + v + "')";
      },
      name);
}
}  // namespace

const CLI::Validator kPositive = number_check([](double x) { return x > 0; }, "a number > 0", "NUMBER>0");
const CLI::Validator kNonNegative = number_check([](double x) { return x >= 0; }, "a number >= 0", "NUMBER>=0");
const CLI::Validator kShare = number_check([](double x) { return x > 0 && x <= 1; }, "a share in (0, 1]", "SHARE in (0, 1]");

void ReportFiles::add(CLI::App* cmd, bool bench) {
  cmd->add_option("--html", html, "also write a self-contained HTML report (plots, matrix, tables) here");
  cmd->add_option("--markdown", markdown, "also write the summary as Markdown (verdict on the first line) here");
  if (bench)
    cmd->add_option("--bench-json", bench_json, "put this `tinygpt bench --json` report's table and chart in the HTML/Markdown")
        ->check(CLI::ExistingFile);
}

void add_run_options(CLI::App* cmd, RunOptions& opts) {
  cmd->add_option("--device", opts.device, "cpu, cuda or cuda:N (CUDA needs a CUDA LibTorch)")
      ->capture_default_str();
  cmd->add_option("--threads", opts.threads,
                  "intra-op CPU threads (default: the cores this process may use)")
      ->check(kPositive);
}

c10::Device apply_run_options(const RunOptions& opts) {
  set_threads(opts.threads > 0 ? opts.threads : available_cores());
  return parse_device(opts.device);
}

std::vector<int64_t> parse_ids(const std::string& text, int64_t vocab, const std::string& option) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw std::invalid_argument(option + ": '" + item + "' is not an integer token id");
    if (v < 0 || v >= vocab)
      throw std::invalid_argument(option + ": id " + item + " outside [0, " + std::to_string(vocab) + ")");
    ids.push_back(v);
  }
  if (ids.empty() || (!text.empty() && text.back() == ','))
    throw std::invalid_argument(option + ": expected comma-separated ids such as 1,2,3");
  return ids;
}

std::vector<int64_t> prompt_ids(const std::string& ids, const std::string& prompt, const Tokenizer* tok,
                                int64_t vocab) {
  if (!prompt.empty() && !tok)
    throw std::invalid_argument("--prompt needs --tokenizer (or a --checkpoint directory holding tokenizer.json)");
  if (tok) tok->check_serves(vocab, "--tokenizer");
  if (prompt.empty()) return parse_ids(ids, vocab, "--ids");
  auto out = tok->encode(prompt);
  if (out.empty()) throw std::invalid_argument("--prompt encodes to no tokens");
  return out;
}

const char* const kTokenizerHelp =
    "tokenizer.json for --prompt: the series' or a Hugging Face directory's own (default: the --checkpoint\n"
    "directory's tokenizer.json, where there is one)";

std::string tokenizer_for(const std::string& given, const std::string& checkpoint) {
  if (!given.empty()) return given;
  if (!checkpoint.empty() && std::filesystem::is_regular_file(std::filesystem::path(checkpoint) / "tokenizer.json"))
    return (std::filesystem::path(checkpoint) / "tokenizer.json").string();
  return "";
}

at::Tensor ids_tensor(const std::vector<int64_t>& ids, int64_t batch, c10::Device device) {
  if (batch < 1) throw std::invalid_argument("--batch must be >= 1");
  at::Tensor row = at::tensor(ids, at::kLong).unsqueeze(0);  // (1, n)
  return row.repeat({batch, 1}).to(device);                  // (batch, n)
}

std::string join_ids(const at::Tensor& row) {
  at::Tensor r = row.to(at::kCPU).contiguous();
  return join_ids(std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()));
}

std::string join_ids(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

}  // namespace tinygpt::cli
