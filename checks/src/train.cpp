#include "train.h"

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tinygpt/checks/golden.h"
#include "report.h"
#include "tinygpt/device.h"
#include "tinygpt/gpt.h"
#include "tinygpt/safetensors.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::checks {

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

}  // namespace

TrainSummary train(const TrainOptions& o, c10::Device device, const std::function<void(const std::string&)>& log) {
  if (o.steps < 1 || o.batch < 1 || !(o.lr > 0)) throw std::invalid_argument("train: steps, batch and lr must be positive");
  fs::create_directories(o.out_dir);
  Tokenizer tok = Tokenizer::load(o.tokenizer);
  const std::string text = read_file(o.corpus);
  log("train: encoding " + std::to_string(text.size()) + " bytes of corpus");
  const std::vector<int64_t> all = tok.encode(text);
  Config cfg;
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

  const fs::path dir(o.out_dir);
  const fs::path last_ckpt = dir / "last.safetensors", last_opt = dir / "last.optim", state_file = dir / "train_state.json";
  const fs::path best_ckpt = dir / "best.safetensors", csv = dir / "train_log.csv";
  int64_t start = 0;
  double best_val = INFINITY;
  if (o.resume && fs::exists(state_file)) {
    auto st = nlohmann::json::parse(std::ifstream(state_file));
    start = st.at("step").get<int64_t>();
    best_val = st.at("best_val").get<double>();
    sum.best_step = st.at("best_step").get<int64_t>();
    Checkpoint ck = read_safetensors_checkpoint(last_ckpt.string());
    load_weights(model, ck.tensors);
    torch::load(opt, last_opt.string());
    gen.set_current_seed(o.seed + static_cast<uint64_t>(start));
    log("train: resumed at step " + std::to_string(start));
  } else {
    std::ofstream(csv) << "step,lr,train_loss,val_loss,tokens_per_s,elapsed_s\n";
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

  model->train();
  const auto t0 = std::chrono::steady_clock::now();
  double tokens_per_s = 0;
  int64_t step = start;
  for (; step < o.steps; ++step) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.max_minutes > 0 && elapsed > o.max_minutes * 60) {
      log("train: time limit reached at step " + std::to_string(step));
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
      write_safetensors_checkpoint(last_ckpt.string(), snapshot(step + 1), metadata(step + 1, v));
      torch::save(opt, last_opt.string());
      write_json_atomically(state_file.string(), {{"step", step + 1}, {"best_val", best_val}, {"best_step", sum.best_step}});
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream(csv, std::ios::app) << step + 1 << "," << lr << "," << sum.last_train << ","
                                      << (eval_now ? std::to_string(v) : "") << "," << tokens_per_s << "," << el << "\n";
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

}  // namespace tinygpt::checks
