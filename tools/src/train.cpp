#include "tinygpt/tools/train.h"

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tinygpt/zoo.h"
#include "tinygpt/checks/golden.h"
#include "tinygpt/atomic_file.h"
#include "tinygpt/device.h"
#include "tinygpt/errors.h"
#include "tinygpt/gpt.h"
#include "tinygpt/safetensors.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::tools {

using namespace checks;

namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open corpus");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

double lr_at(int64_t step, int64_t steps, double lr) {
  const int64_t warm = std::max<int64_t>(1, std::min<int64_t>(200, steps / 10));
  if (step < warm) return lr * static_cast<double>(step + 1) / warm;
  const double progress = static_cast<double>(step - warm) / std::max<int64_t>(1, steps - warm);
  return lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress))));
}

// x, y: (B, T) windows starting at `starts` in `ids`.
std::pair<at::Tensor, at::Tensor> windows(const at::Tensor& ids, const at::Tensor& starts, int64_t T) {
  at::Tensor offs = at::arange(T + 1, at::kLong).unsqueeze(0) + starts.unsqueeze(1);  // (B, T+1)
  at::Tensor w = ids.index({offs});
  return {w.narrow(1, 0, T), w.narrow(1, 1, T)};
}

at::Tensor loss_of(GPT& model, const at::Tensor& x, const at::Tensor& y) {
  at::Tensor logits = model->forward(x);  // (B, T, V)
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
}

// The window generator's state (a CPU byte tensor) as hex text for the JSON state file, and back.
std::string to_hex(const at::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  const at::Tensor b = bytes.contiguous();
  const uint8_t* p = b.data_ptr<uint8_t>();
  std::string s;
  s.reserve(static_cast<size_t>(2 * b.numel()));
  for (int64_t i = 0; i < b.numel(); ++i) s += {digits[p[i] >> 4], digits[p[i] & 15]};
  return s;
}

at::Tensor from_hex(const std::string& s) {
  if (s.size() % 2 != 0 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw InputError("train_state.json: generator state is not hex");
  at::Tensor b = at::empty({static_cast<int64_t>(s.size() / 2)}, at::kByte);
  uint8_t* p = b.data_ptr<uint8_t>();
  auto nib = [](char c) { return static_cast<uint8_t>(c <= '9' ? c - '0' : c - 'a' + 10); };
  for (size_t i = 0; i < s.size() / 2; ++i) p[i] = static_cast<uint8_t>(nib(s[2 * i]) << 4 | nib(s[2 * i + 1]));
  return b;
}

}  // namespace

TrainSummary train(const TrainOptions& o, c10::Device device, const std::function<void(const std::string&)>& log) {
  if (o.steps < 1 || o.batch < 1 || !(o.lr > 0)) throw std::invalid_argument("train: steps, batch and lr must be positive");
  fs::create_directories(o.out_dir);
  Tokenizer tok = Tokenizer::load(o.tokenizer);
  const std::string text = read_file(o.corpus);
  log("train: encoding " + std::to_string(text.size()) + " bytes of corpus");
  const std::vector<int64_t> all = tok.encode(text);
  // SPEC 10's knobs for a zoo member; the seed's architecture, smaller, for the speculative draft.
  Config cfg = o.arch.empty() ? Config{} : o.arch == "draft" ? draft_config() : zoo_config(o.arch);
  cfg.vocab_size = tok.vocab_size();
  cfg.validate();
  const int64_t T = cfg.context;
  const int64_t split = static_cast<int64_t>(all.size() * 0.9);
  at::Tensor ids = at::tensor(all, at::kLong);
  at::Tensor train_ids = ids.narrow(0, 0, split), val_ids = ids.narrow(0, split, ids.size(0) - split);
  if (train_ids.size(0) <= T + 1 || val_ids.size(0) <= T + 1) throw std::invalid_argument("train: corpus too small");
  TrainSummary sum;
  sum.train_tokens = train_ids.size(0);
  sum.val_tokens = val_ids.size(0);

  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  // Fixed validation batches: the same windows at every evaluation.
  std::vector<std::pair<at::Tensor, at::Tensor>> val;
  for (int64_t b = 0; b < o.eval_batches; ++b) {
    auto [x, y] = windows(val_ids, at::randint(0, val_ids.size(0) - T - 1, {o.batch}, gen, at::kLong), T);
    val.emplace_back(x.to(device), y.to(device));
  }

  GPT model(cfg, o.seed);
  model->to(device);
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  torch::optim::AdamW opt({torch::optim::OptimizerParamGroup(decay, std::make_unique<torch::optim::AdamWOptions>(
                                                                         torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).weight_decay(0.1))),
                           torch::optim::OptimizerParamGroup(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                                                           torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).weight_decay(0.0)))},
                          torch::optim::AdamWOptions(o.lr));

  // Files. The resume state is one generation: resume/step-N.safetensors (weights),
  // resume/step-N.optim (AdamW's moments and step counts) and train_state.json, which names them
  // and holds the window generator's state. Each file is written atomically, the state file
  // last: it is the commit point, so a kill at any moment leaves a state file naming a complete
  // generation (the new one or the one before). last.safetensors and best.safetensors are
  // written atomically too, for users; --resume never reads them.
  const fs::path dir(o.out_dir);
  const fs::path resume_dir = dir / "resume", state_file = dir / "train_state.json";
  const fs::path last_ckpt = dir / "last.safetensors", best_ckpt = dir / "best.safetensors", csv = dir / "train_log.csv";
  const std::string csv_header = "step,lr,train_loss,val_loss,tokens_per_s,elapsed_s\n";
  int64_t start = 0;
  double best_val = INFINITY;
  if (o.resume && fs::exists(state_file)) {
    nlohmann::json st;
    try {
      st = nlohmann::json::parse(std::ifstream(state_file));
      start = st.at("step").get<int64_t>();
      best_val = st.at("best_val").get<double>();
      sum.best_step = st.at("best_step").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      throw InputError(state_file.string() + ": not a train state (" + e.what() + ")");
    }
    if (!st.contains("weights") || !st.contains("optim") || !st.contains("generator"))
      throw InputError(state_file.string() + ": written by an older tinygpt train that did not keep the generator; "
                       "resume is not exact: start again without --resume");
    const fs::path weights = dir / st.at("weights").get<std::string>(), optim = dir / st.at("optim").get<std::string>();
    for (const fs::path& f : {weights, optim})
      if (!fs::exists(f)) throw InputError(f.string() + ": missing, but " + state_file.string() + " names it");
    Checkpoint ck = read_safetensors_checkpoint(weights.string());
    load_weights(model, ck.tensors);
    torch::load(opt, optim.string());
    gen.set_state(from_hex(st.at("generator").get<std::string>()));
    // A kill while last.safetensors was copied leaves it one generation behind the committed
    // state; when that state is the final step no save follows, so bring it up to date now.
    write_atomically_via(last_ckpt.string(), [&](const std::string& tmp) { fs::copy_file(weights, tmp); });
    // Rows logged after the last saved step are run again: drop them so each step appears once.
    std::ifstream in(csv);
    std::string line, kept = csv_header;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {  // a kill mid-append can leave a partial last row: it goes too
      const std::string first = line.substr(0, line.find(','));
      const bool whole = std::count(line.begin(), line.end(), ',') == 5 && !first.empty() &&
                         first.find_first_not_of("0123456789") == std::string::npos && first.size() < 18;
      if (whole && std::stoll(first) <= start) kept += line + "\n";
    }
    write_atomically(csv.string(), [&](std::ostream& out) { out << kept; });
    log("train: resumed at step " + std::to_string(start));
  } else {
    write_atomically(csv.string(), [&](std::ostream& out) { out << csv_header; });
  }

  auto evaluate = [&]() {
    at::NoGradGuard ng;
    model->eval();
    double total = 0;
    for (const auto& [x, y] : val) total += loss_of(model, x, y).item<double>();
    model->train();
    return total / static_cast<double>(val.size());
  };
  auto metadata = [&](int64_t step, double v) {
    return std::map<std::string, std::string>{{"steps", std::to_string(step)},
                                              {"val_loss", std::to_string(v)},
                                              {"corpus", fs::path(o.corpus).filename().string()},
                                              {"command", o.command},
                                              {"libtorch", libtorch_version()},
                                              {"commit", git_commit()}};
  };
  auto snapshot = [&](int64_t step) {
    Checkpoint ck{cfg, step, model->state_dict(), {}, {}};
    return ck;
  };

  // One resume generation for `done` steps, committed by the state file (see above).
  auto save_resume = [&](int64_t done, double v) {
    char stem[32];
    std::snprintf(stem, sizeof stem, "step-%09lld", static_cast<long long>(done));
    const std::string weights = "resume/" + std::string(stem) + ".safetensors", optim = "resume/" + std::string(stem) + ".optim";
    fs::create_directories(resume_dir);
    write_safetensors_checkpoint((dir / weights).string(), snapshot(done), metadata(done, v));
    write_atomically_via((dir / optim).string(), [&](const std::string& tmp) { torch::save(opt, tmp); });
    write_json_atomically(state_file.string(), {{"step", done}, {"best_val", best_val}, {"best_step", sum.best_step},
                                                {"weights", weights}, {"optim", optim}, {"generator", to_hex(gen.get_state())}});
    // Committed: earlier generations (and anything a kill left half-written) go.
    for (const auto& e : fs::directory_iterator(resume_dir))
      if (e.path().filename().string().rfind(stem, 0) != 0) fs::remove(e.path());
    // The same bytes for users: a copy, not a second serialisation of the weights.
    write_atomically_via(last_ckpt.string(), [&](const std::string& tmp) { fs::copy_file(dir / weights, tmp); });
  };

  model->train();
  const auto t0 = std::chrono::steady_clock::now();
  double tokens_per_s = 0;
  int64_t step = start;
  for (; step < o.steps; ++step) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.max_minutes > 0 && elapsed > o.max_minutes * 60) {
      log("train: time limit reached at step " + std::to_string(step));
      if (step > start) save_resume(step, NAN);
      break;
    }
    const double lr = lr_at(step, o.steps, o.lr);
    for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    auto [x, y] = windows(train_ids, at::randint(0, train_ids.size(0) - T - 1, {o.batch}, gen, at::kLong), T);
    const auto ts = std::chrono::steady_clock::now();
    opt.zero_grad();
    at::Tensor loss = loss_of(model, x.to(device), y.to(device));
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    sum.last_train = loss.item<double>();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    tokens_per_s = 0.9 * (tokens_per_s ? tokens_per_s : o.batch * T / dt) + 0.1 * (o.batch * T / dt);
    const bool eval_now = (step + 1) % o.eval_every == 0 || step + 1 == o.steps;
    double v = NAN;
    if (eval_now) {
      v = evaluate();
      if (v < best_val) {
        best_val = v;
        sum.best_step = step + 1;
        write_safetensors_checkpoint(best_ckpt.string(), snapshot(step + 1), metadata(step + 1, v));
      }
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The row goes in before the resume state that covers its step is committed: a kill after the
    // commit (while last.safetensors is copied, say) then cannot lose it, and a kill before the
    // commit leaves a row that the resumed run drops and writes again.
    std::ofstream(csv, std::ios::app) << step + 1 << "," << lr << "," << sum.last_train << ","
                                      << (eval_now ? std::to_string(v) : "") << "," << tokens_per_s << "," << el << "\n";
    if (eval_now) save_resume(step + 1, v);
    if (eval_now || step % 10 == 0) {
      char line[256];
      const double left = (o.steps - step - 1) * (o.batch * T) / std::max(tokens_per_s, 1.0);
      std::snprintf(line, sizeof line, "step %lld/%lld  lr %.2e  train %.4f  val %s  %.0f tok/s  %.0fs elapsed, ~%.0fs left",
                    static_cast<long long>(step + 1), static_cast<long long>(o.steps), lr, sum.last_train,
                    eval_now ? std::to_string(v).c_str() : "-", tokens_per_s, el, left);
      log(line);
    }
  }
  sum.steps_done = step;
  sum.best_val = best_val;
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace tinygpt::tools
