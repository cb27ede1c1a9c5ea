// File commands: convert (.pt <-> .safetensors), encode, decode, train-tokenizer, train.
#include <ATen/ATen.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "tinygpt/torch_checkpoint.h"
#include "tinygpt/tools/train.h"
#include "tinygpt/zoo.h"
#include "tinygpt/checks/data.h"
#include "tinygpt/checks/export.h"
#include "tinygpt/device.h"
#include "tinygpt/safetensors.h"
#include "tinygpt/tokenizer.h"

namespace tinygpt::cli {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

Command add_export(CLI::App& app) {
  struct Opts {
    std::string format, out, checkpoint, tokenizer, quantize, quantizer;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write the model in a format an engine loads: gguf (F32, for llama.cpp: the seed's model as its gptneox\n"
      "architecture, a zoo member as llama, qwen3, gemma2 or gptneox, the q/k rows reordered to the pairing its\n"
      "RoPE turns; a knob no architecture carries is refused by name; written here in C++), onnx (one graph for prefill and\n"
      "decode: ids, start, past K/V in, last logits and present K/V out; a zoo member's knobs in the graph; through\n"
      "python3-torch), pt or\n"
      "safetensors, or hf: a zoo member (--checkpoint golden/zoo/NAME/model.safetensors) as a Hugging Face\n"
      "directory transformers loads as its own class (config.json + model.safetensors + tokenizer.json in the\n"
      "tokenizers library's format; a knob the class cannot carry is refused by name), or transformers-js: the\n"
      "onnx graph in the folder transformers.js loads. Defaults to the shipped fixture. Writes atomically.");
  cmd->add_option("--format", o->format, "gguf, onnx, pt, safetensors, hf or transformers-js")->required()
      ->check(CLI::IsMember(checks::export_formats()));
  cmd->add_option("OUT", o->out, "output file")->required();
  cmd->add_option("--checkpoint", o->checkpoint, "model to export (.pt, .safetensors, or a Hugging Face directory; default: the shipped fixture)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--tokenizer", o->tokenizer,
                  "hf: the tokenizer.json the directory gets: the series' (converted to the tokenizers library's format) or\n"
                  "one already in that format (copied); default: the shipped fixture's, where the model's vocabulary is its size")
      ->check(CLI::ExistingPath);
  cmd->add_option("--quantize", o->quantize,
                  "gguf: the weights quantized to this type (q8_0, q4_0, q4_K_M) by --quantizer, as llama.cpp's users run them;\n"
                  "a tensor whose rows the type's blocks (32; q4_K_M 256) cannot divide is refused by name")
      ->check(CLI::IsMember(checks::gguf_weight_types()));
  cmd->add_option("--quantizer", o->quantizer,
                  "with --quantize: the command that quantizes, called as `CMD IN OUT TYPE` through /bin/sh - llama.cpp's\n"
                  "llama-quantize, or the llama.cpp adapter ci/engines.sh builds: \".engines/llama.cpp/adapter --quantize\"");
  return {cmd, [o] {
            if (!o->tokenizer.empty() && o->format != "hf") throw std::invalid_argument("--tokenizer goes with --format hf");
            if (!o->quantize.empty() && o->format != "gguf") throw std::invalid_argument("--quantize goes with --format gguf");
            if (o->quantize.empty() != o->quantizer.empty())
              throw std::invalid_argument(o->quantize.empty() ? "--quantizer goes with --quantize" : "--quantize needs --quantizer (the command that quantizes)");
            const std::string in = o->checkpoint.empty() ? checks::data_dir() + "/fixture.safetensors" : o->checkpoint;
            Checkpoint ck = read_any_checkpoint(in);
            GPT model = model_from_checkpoint(ck, c10::Device(c10::kCPU), in, &ck.notes);
            Checkpoint clean{ck.config, ck.step, model->state_dict(), {}, ck.metadata};
            if (!o->quantize.empty()) {
              checks::export_quantized_gguf(model, o->quantize, o->quantizer, o->out);
              std::cout << "wrote " << o->out << " (gguf, " << o->quantize << ", from " << in << ")\n";
              return int(kOk);
            }
            checks::export_model(clean, model, o->format, o->out, o->tokenizer);
            std::cout << "wrote " << o->out << " (" << o->format << ", from " << in << ")\n";
            return int(kOk);
          }};
}

Command add_convert(CLI::App& app) {
  auto in = std::make_shared<std::string>(), out = std::make_shared<std::string>();
  auto meta = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("convert",
                                     "Convert a checkpoint between the series' .pt format and .safetensors (by OUT's\n"
                                     "extension), or a Hugging Face directory (config.json + model.safetensors of a\n"
                                     "Llama, Mistral, Qwen3, Gemma 2 or GPT-NeoX model) into .safetensors. Validates every\n"
                                     "tensor against the config first; writes atomically. A model with SPEC 10's\n"
                                     "architecture knobs has no .pt form (the series' config has no place for them).");
  cmd->add_option("IN", *in, "input checkpoint (.pt, .safetensors, or a Hugging Face directory)")->required()->check(CLI::ExistingPath);
  cmd->add_option("OUT", *out, "output path ending in .pt or .safetensors")->required();
  cmd->add_option("--meta", *meta, "KEY=VALUE provenance to add to a .safetensors output (repeatable)");
  return {cmd, [in, out, meta] {
            Checkpoint ck = read_any_checkpoint(*in);
            // Validation: names, shapes, dtypes, finite; a bad file is one line naming it.
            GPT model = model_from_checkpoint(ck, c10::Device(c10::kCPU), *in, &ck.notes);
            for (const auto& n : ck.notes) std::cerr << "convert: " << n << "\n";
            Checkpoint clean{ck.config, ck.step, model->state_dict(), {}, ck.metadata};
            std::map<std::string, std::string> extra;
            for (const auto& kv : *meta) {
              const auto eq = kv.find('=');
              if (eq == std::string::npos || eq == 0) throw std::invalid_argument("--meta expects KEY=VALUE, got '" + kv + "'");
              extra[kv.substr(0, eq)] = kv.substr(eq + 1);
            }
            if (ends_with(*out, ".safetensors")) write_safetensors_checkpoint(*out, clean, extra);
            else if (ends_with(*out, ".pt") && meta->empty()) write_torch_checkpoint(*out, clean);
            else if (ends_with(*out, ".pt")) throw std::invalid_argument("--meta needs a .safetensors output");
            else throw std::invalid_argument("OUT must end in .pt or .safetensors: " + *out);
            std::cout << "wrote " << *out << " (" << clean.tensors.size() << " tensors, step " << clean.step << ")\n";
            return int(kOk);
          }};
}

Command add_encode(CLI::App& app) {
  auto tok = std::make_shared<std::string>(), text = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("encode", "Print the token ids of TEXT, comma-separated");
  cmd->add_option("--tokenizer", *tok, "tokenizer.json (or a directory holding one): the series' or the tokenizers library's")
      ->required()->check(CLI::ExistingPath);
  cmd->add_option("TEXT", *text, "text to encode")->required();
  return {cmd, [tok, text] {
            const auto ids = Tokenizer::load(*tok).encode(*text);
            std::string s;
            for (auto id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
            std::cout << s << "\n";
            return int(kOk);
          }};
}

Command add_decode(CLI::App& app) {
  auto tok = std::make_shared<std::string>(), ids = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("decode", "Print the text of comma-separated token IDS");
  cmd->add_option("--tokenizer", *tok, "tokenizer.json (or a directory holding one): the series' or the tokenizers library's")
      ->required()->check(CLI::ExistingPath);
  cmd->add_option("IDS", *ids, "comma-separated ids")->required();
  return {cmd, [tok, ids] {
            Tokenizer t = Tokenizer::load(*tok);
            std::cout << t.decode(parse_ids(*ids, t.vocab_size(), "IDS")) << "\n";
            return int(kOk);
          }};
}

Command add_train_tokenizer(CLI::App& app) {
  auto corpus = std::make_shared<std::string>(), out = std::make_shared<std::string>();
  auto vocab = std::make_shared<int64_t>(4096);
  CLI::App* cmd = app.add_subcommand("train-tokenizer", "Train the series' byte-level BPE on a corpus");
  cmd->add_option("--corpus", *corpus, "UTF-8 text file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--vocab", *vocab, "vocabulary size (>= 256)")->capture_default_str()->check(CLI::Range(256, 1 << 20));
  cmd->add_option("--out", *out, "tokenizer.json to write (atomically)")->required();
  return {cmd, [corpus, out, vocab] {
            std::ifstream in(*corpus, std::ios::binary);
            std::ostringstream s;
            s << in.rdbuf();
            const auto t0 = std::chrono::steady_clock::now();
            Tokenizer t = Tokenizer::train(s.str(), *vocab, [](int64_t done, int64_t total) {
              std::cerr << "train-tokenizer: " << done << "/" << total << " merges\n";
            });
            t.save(*out);
            const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::cout << "wrote " << *out << ": vocab " << t.vocab_size() << " in " << sec << " s\n";
            return int(kOk);
          }};
}

Command add_train(CLI::App& app) {
  auto o = std::make_shared<tools::TrainOptions>();
  auto run = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train the default config on a corpus with the series' Part 3 recipe. Writes best.safetensors (best\n"
      "validation loss), last.safetensors, train_log.csv, and train_state.json + resume/ (for --resume) into\n"
      "--out, each file atomically at every validation: a run killed at any moment resumes from its last\n"
      "validation and reaches the same weights as one never stopped (same seed, device and --threads).");
  cmd->add_option("--corpus", o->corpus, "UTF-8 text file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", o->out_dir, "output directory")->required();
  cmd->add_option("--steps", o->steps, "optimizer steps")->capture_default_str()->check(kPositive);
  cmd->add_option("--batch", o->batch, "windows per step")->capture_default_str()->check(kPositive);
  cmd->add_option("--lr", o->lr, "peak learning rate")->capture_default_str()->check(kPositive);
  cmd->add_option("--eval-every", o->eval_every, "steps between validations")->capture_default_str()->check(kPositive);
  cmd->add_option("--seed", o->seed, "seed of weights, windows and validation batches")->capture_default_str();
  cmd->add_option("--arch", o->arch, "a zoo member's architecture instead of the seed's (llama, mqa, mistral, gemma2, qwen3,\n"
                                      "neox: docs/SPEC.md section 10), or draft: the seed's at d_model 128 and 2 layers, the\n"
                                      "fixture's speculative draft (ci/make-draft.sh)")
      ->check([](const std::string& a) -> std::string {
        if (a == "draft") return "";
        for (const auto& n : zoo_names())
          if (a == n) return "";
        return "unknown architecture '" + a + "' (llama, mqa, mistral, gemma2, qwen3, neox, draft)";
      });
  cmd->add_option("--max-minutes", o->max_minutes, "stop (saved) after this long; 0 = no limit")->capture_default_str();
  cmd->add_flag("--resume", o->resume, "continue from --out's last validation (weights, optimizer, window generator, log)");
  add_run_options(cmd, *run);
  return {cmd, [o, run] {
            const c10::Device dev = apply_run_options(*run);
            std::ostringstream c;
            c << "tinygpt train --corpus " << o->corpus << " --tokenizer " << o->tokenizer << " --steps " << o->steps
              << " --batch " << o->batch << " --seed " << o->seed << (o->arch.empty() ? "" : " --arch " + o->arch);
            o->command = c.str();
            const auto s = tools::train(*o, dev, [](const std::string& l) { std::cerr << l << "\n"; });
            std::cout << "trained " << s.steps_done << " steps in " << s.seconds << " s; best val " << s.best_val
                      << " at step " << s.best_step << "; last train " << s.last_train << "\n";
            return int(kOk);
          }};
}

}  // namespace tinygpt::cli
