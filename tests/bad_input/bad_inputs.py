#!/usr/bin/env python3
"""The bad-input table: every loader and argument of the command line fed something
wrong. Each case must exit 2 with exactly one line on stderr, "tinygpt: error: ...", naming the
file or field, and never a crash, an abort, a LibTorch internal assert or a backtrace; a case that
writes must leave no file behind. Files are made here (Debian's python3-torch writes the .pt
variants as the series' torch.save does). Usage: bad_inputs.py TINYGPT WORK_DIR
"""
import json
import os
import struct
import subprocess
import sys
from collections import OrderedDict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import series_reference as ref  # noqa: E402

TINY = {"vocab_size": 8, "d_model": 8, "n_heads": 2, "n_layers": 1, "context": 4, "dropout": 0.1}
FORBIDDEN = ("terminate called", "Aborted", "Segmentation", "Exception raised from", "INTERNAL ASSERT",
             "frame #", "AddressSanitizer", "runtime error:")


def tiny_state():
    torch.manual_seed(0)
    return ref.GPT(TINY).state_dict()


def save_pt(path, model, config=TINY):
    torch.save({"model": model, "config": dict(config), "step": 1}, path)


def safetensors(path, header, body=b"", length=None):
    h = json.dumps(header).encode() if isinstance(header, (dict, list)) else header
    n = len(h) if length is None else length
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + h + body)


def make_files(d):
    files = {}
    sd = tiny_state()
    p = lambda name: os.path.join(d, name)  # noqa: E731
    save_pt(p("good.pt"), sd)
    files["good.pt"] = p("good.pt")
    raw = open(p("good.pt"), "rb").read()
    open(p("truncated.pt"), "wb").write(raw[: len(raw) // 2])
    open(p("random.pt"), "wb").write(os.urandom(3000))
    open(p("empty.pt"), "wb").write(b"")
    missing = OrderedDict(sd)
    del missing["blocks.0.mlp.0.bias"]
    save_pt(p("missing.pt"), missing)
    extra = OrderedDict(sd)
    extra["blocks.0.extra"] = torch.zeros(3)
    save_pt(p("extra.pt"), extra)
    shape = OrderedDict(sd)
    shape["norm.weight"] = torch.ones(9)
    save_pt(p("shape.pt"), shape)
    dtype = OrderedDict(sd)
    dtype["norm.bias"] = torch.zeros(8, dtype=torch.int64)
    save_pt(p("dtype.pt"), dtype)
    nan = OrderedDict(sd)
    nan["blocks.0.attn.out.weight"] = sd["blocks.0.attn.out.weight"].clone()
    nan["blocks.0.attn.out.weight"][0, 0] = float("nan")
    save_pt(p("nan.pt"), nan)
    save_pt(p("config.pt"), sd, dict(TINY, n_heads=3))
    save_pt(p("evil.pt"), ref.Evil())
    untied = OrderedDict(sd)
    untied["head.weight"] = sd["emb.weight"].clone() + 1
    save_pt(p("untied.pt"), untied)
    # safetensors that lie
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    safetensors(p("len_past_end.safetensors"), {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, f32, length=10**6)
    safetensors(p("bad_json.safetensors"), b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]', f32)
    safetensors(p("overlap.safetensors"), {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, f32)
    safetensors(p("out_of_bounds.safetensors"), {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 160]}}, f32)
    safetensors(p("duplicate.safetensors"),
                b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', f32)
    safetensors(p("absurd.safetensors"), b"{}", b"", length=2**62)
    safetensors(p("size_mismatch.safetensors"), {"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, f32)
    safetensors(p("huge_shape.safetensors"), {"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 16]}}, f32)
    # Hugging Face checkpoint directories that --checkpoint DIR must refuse by name
    hf = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8,
          "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1, "intermediate_size": 8,
          "max_position_embeddings": 4, "hidden_act": "silu", "rms_norm_eps": 1e-6}
    emb = struct.pack("<64f", *([0.5] * 64))
    for name, cfg, weights in [
        ("hf-falcon", dict(hf, model_type="falcon", architectures=["FalconForCausalLM"]), True),
        ("hf-act", dict(hf, hidden_act="relu"), True),
        ("hf-mscale", dict(hf, rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale": 1.0}), True),
        ("hf-kv", dict(hf, num_key_value_heads=3), True),
        ("hf-noweights", hf, False),
        ("hf-short", hf, True),
    ]:
        os.makedirs(p(name), exist_ok=True)
        json.dump(cfg, open(os.path.join(p(name), "config.json"), "w"))
        if weights:  # the embedding alone: every other tensor is missing
            safetensors(os.path.join(p(name), "model.safetensors"),
                        {"model.embed_tokens.weight": {"dtype": "F32", "shape": [8, 8], "data_offsets": [0, 256]}}, emb)
    # tokenizers
    json.dump({"merges": [[32, 300]]}, open(p("tok_future.json"), "w"))
    json.dump({"merges": [[-1, 32]]}, open(p("tok_negative.json"), "w"))
    json.dump({"merges": [[32, 32], [256, 256], [257, 257], [258, 10**18]]}, open(p("tok_absurd.json"), "w"))
    json.dump({"merges": [[32]]}, open(p("tok_notpair.json"), "w"))
    open(p("tok_notjson.json"), "w").write("{merges: [[1, 2]")
    json.dump({"merges": [[32, 32], [32, 32]]}, open(p("tok_repeat.json"), "w"))
    json.dump({"merges": [[256, 32]]}, open(p("tok_self.json"), "w"))
    json.dump({"vocab": {}}, open(p("tok_nomerges.json"), "w"))
    json.dump({"merges": [[32, 32]]}, open(p("tok_small.json"), "w"))
    # golden folders: the shipped fixture with its goldens missing, broken, or short of a field
    import shutil
    golden = os.path.join(HERE, "..", "..", "golden")
    for name in ("golden-empty", "golden-broken", "golden-field", "golden-float"):
        g = p(name)
        os.makedirs(g, exist_ok=True)
        for f in ("fixture.safetensors", "tokenizer.json"):
            if not os.path.exists(os.path.join(g, f)):
                os.symlink(os.path.abspath(os.path.join(golden, f)), os.path.join(g, f))
        if name != "golden-empty":
            for f in ("greedy_600.json", "sample_grid.json", "sampler_selfcheck.json"):
                shutil.copy(os.path.join(golden, f), os.path.join(g, f))
    text = open(os.path.join(golden, "sample_grid.json")).read()
    open(os.path.join(p("golden-broken"), "sample_grid.json"), "w").write(text[: len(text) // 2])
    doc = json.load(open(os.path.join(golden, "sampler_selfcheck.json")))
    doc.pop("case", None)
    json.dump(doc, open(os.path.join(p("golden-field"), "sampler_selfcheck.json"), "w"))
    # Found by fuzz/fuzz_golden.cpp: a float where an id goes (get<int64_t>() of 1e54 was undefined behaviour).
    doc = json.load(open(os.path.join(golden, "greedy_600.json")))
    doc["rows"][0]["ids"][5] = 1.11111e54
    json.dump(doc, open(os.path.join(p("golden-float"), "greedy_600.json"), "w"))
    return files


def cases(d, fixture_dir):
    p = lambda name: os.path.join(d, name)  # noqa: E731
    gen = lambda f: ["generate", "--checkpoint", p(f), "--ids", "1,2", "--tokens", "1"]  # noqa: E731
    enc = lambda f: ["encode", "--tokenizer", p(f), "hello"]  # noqa: E731
    nowhere = "/nonexistent-dir/out"
    return [
        ("truncated .pt", gen("truncated.pt"), "truncated.pt", None),
        ("random bytes as .pt", gen("random.pt"), "random.pt", None),
        ("empty checkpoint", gen("empty.pt"), "empty.pt", None),
        ("missing tensor", gen("missing.pt"), "blocks.0.mlp.0.bias", None),
        ("extra tensor", gen("extra.pt"), "blocks.0.extra", None),
        ("wrong shape", gen("shape.pt"), "norm.weight", None),
        ("wrong dtype", gen("dtype.pt"), "LongStorage", None),
        ("NaN weight", gen("nan.pt"), "NaN", None),
        ("inconsistent config", gen("config.pt"), "n_heads", None),
        ("pickle naming another global", gen("evil.pt"), "system", None),
        ("untied head", gen("untied.pt"), "head.weight", None),
        ("safetensors header length past the end", gen("len_past_end.safetensors"), "len_past_end.safetensors", None),
        ("safetensors invalid JSON", gen("bad_json.safetensors"), "bad_json.safetensors", None),
        ("safetensors overlapping offsets", gen("overlap.safetensors"), "overlap.safetensors", None),
        ("safetensors out-of-bounds offsets", gen("out_of_bounds.safetensors"), "out_of_bounds.safetensors", None),
        ("safetensors duplicate names", gen("duplicate.safetensors"), "duplicate.safetensors", None),
        ("safetensors absurd header size", gen("absurd.safetensors"), "absurd.safetensors", None),
        ("safetensors bytes != dtype x shape", gen("size_mismatch.safetensors"), "size_mismatch.safetensors", None),
        ("safetensors absurd shape", gen("huge_shape.safetensors"), "huge_shape.safetensors", None),
        ("tokenizer merge of a future id", enc("tok_future.json"), "merge 0", None),
        ("tokenizer merge of a negative id", enc("tok_negative.json"), "merge 0", None),
        ("tokenizer absurd id", enc("tok_absurd.json"), "merge 3", None),
        ("tokenizer merge not a pair", enc("tok_notpair.json"), "tok_notpair.json", None),
        ("tokenizer not JSON", enc("tok_notjson.json"), "not valid JSON", None),
        ("tokenizer repeated merge", enc("tok_repeat.json"), "repeats", None),
        ("tokenizer merge of itself (a cycle)", enc("tok_self.json"), "merge 0", None),
        ("tokenizer without merges", enc("tok_nomerges.json"), "merges", None),
        ("missing checkpoint file", gen("no-such-file.pt"), "no-such-file.pt", None),
        ("HF directory of another architecture", gen("hf-falcon"), "falcon", None),
        ("a directory that is no checkpoint", gen("golden-empty"), "config.json", None),
        ("HF activation no knob expresses", gen("hf-act"), "hidden_act", None),
        ("HF YaRN with mscale", gen("hf-mscale"), "mscale", None),
        ("HF KV heads not dividing the heads", gen("hf-kv"), "n_kv_heads", None),
        ("HF directory without model.safetensors", gen("hf-noweights"), "model.safetensors", None),
        ("HF weights missing a tensor", gen("hf-short"), "model.layers.0.input_layernorm.weight", None),
        ("empty prompt", ["generate", "--ids", "", "--tokens", "1"], "--ids", None),
        ("id outside the vocabulary", ["generate", "--ids", "1,4096"], "4096", None),
        ("negative id", ["generate", "--ids", "-1"], "-1", None),
        ("temperature below 0", ["generate", "--temperature", "-1"], "temperature", None),
        ("top-p 0", ["generate", "--temperature", "1", "--top-p", "0"], "top", None),
        ("top-p above 1", ["generate", "--temperature", "1", "--top-p", "1.5"], "top", None),
        ("top-k below 0", ["generate", "--temperature", "1", "--top-k", "-1"], "top", None),
        ("penalty 0", ["generate", "--temperature", "1", "--penalty", "0"], "penalty", None),
        ("NaN temperature", ["generate", "--temperature", "nan"], "temperature", None),
        ("zero threads", ["generate", "--threads", "0"], "threads", None),
        ("unknown device", ["generate", "--device", "tpu"], "device", None),
        ("unwritable convert output", ["convert", p("good.pt"), nowhere + "/x.safetensors"], "nonexistent-dir", nowhere + "/x.safetensors"),
        ("unwritable tokenizer output", ["train-tokenizer", "--corpus", os.path.join(HERE, "bad_inputs.py"), "--vocab", "260",
                                         "--out", nowhere + "/t.json"], "nonexistent-dir", nowhere + "/t.json"),
        ("golden folder without goldens", ["golden", "verify", "--dir", p("golden-empty")], "golden file missing", None),
        ("golden file that is not JSON", ["golden", "verify", "--dir", p("golden-broken")], "not valid JSON", None),
        ("golden case that does not exist", ["golden", "verify", "--case", "greedy-601"], "no case 'greedy-601'", None),
        ("golden file with a field missing", ["golden", "verify", "--dir", p("golden-field")], "malformed golden file", None),
        ("golden file with a float where an id goes", ["golden", "verify", "--dir", p("golden-float")],
         "ids must be an integer", None),
        ("prompt text without a tokenizer", ["generate", "--prompt", "hello"], "tokenizer", None),
        ("tokenizer of another vocabulary", ["generate", "--prompt", "hi", "--tokenizer", p("tok_small.json")], "vocab", None),
        ("verify of a row it does not run", ["verify", "--checks", "tokens,self", "--json", p("verify.json")],
         "'self' is not a row verify runs", p("verify.json")),
        ("conform engine that is not there", ["conform", "--engine", "/nonexistent/engine"], "hello", None),
        ("a top-1 share of 0 (no bound at all)", ["conform", "--engine", "/nonexistent/engine", "--min-top1", "0"],
         "must be a share in (0, 1]", None),
        ("a KV top-1 share over 1", ["conform", "--engine", "/nonexistent/engine", "--kv-min-top1", "1.5"],
         "must be a share in (0, 1]", None),
        ("--quick past the context", ["verify", "--quick", "--tokens", "300", "--json", p("vq.json")],
         "--quick keeps every run inside the context of 256 tokens: --tokens 300 is past it", p("vq.json")),
        ("a verify tolerance of 0", ["verify", "--tolerance", "0", "--json", p("vt.json")], "--tolerance", p("vt.json")),
        ("a batch size that is not a number", ["conform", "--engine", "/nonexistent/engine", "--batch-sizes", "1-4,x"],
         "'x' is not a size or a range A-B", None),
        ("batch sizes out of order", ["conform", "--engine", "/nonexistent/engine", "--batch-sizes", "8,1-4"],
         "the sizes must be ascending, each once ('1-4' after 8)", None),
        ("a batch size of 0", ["conform", "--engine", "/nonexistent/engine", "--batch-sizes", "0-4"],
         "'0-4' is not a size >= 1", None),
        ("speculative bench of a draft kind that does not exist", ["bench", "--speculative", "--spec-draft", "oracle", "--json", p("sb.json")],
         "unknown draft 'oracle'", p("sb.json")),
        ("speculative bench of a draft that is not there", ["bench", "--speculative", "--draft", p("nope.safetensors")],
         "nope.safetensors", None),
        ("speculative bench of a draft of another vocabulary", ["bench", "--speculative", "--draft", p("good.pt"), "--batch", "1"],
         "vocabulary", None),
        ("seed's fixture exported as a Hugging Face directory", ["export", "--format", "hf", nowhere + "/hf"], "rope_pairing", nowhere + "/hf"),
        ("a quantized export without a quantizer", ["export", "--format", "gguf", "--quantize", "q4_0", p("q.gguf")],
         "--quantize needs --quantizer", p("q.gguf")),
        ("a quantized export of another format", ["export", "--format", "onnx", "--quantize", "q4_0", "--quantizer", "true", p("q.onnx")],
         "--quantize goes with --format gguf", p("q.onnx")),
        ("a weight type the export does not know", ["export", "--format", "gguf", "--quantize", "q5_1", "--quantizer", "true", p("q.gguf")],
         "q5_1", p("q.gguf")),
        ("a width q4_K_M's blocks cannot divide", ["export", "--format", "gguf", "--quantize", "q4_K_M", "--quantizer", "true",
                                                   "--checkpoint", os.path.join(HERE, "..", "..", "golden", "zoo", "llama", "model.safetensors"),
                                                   p("q.gguf")], "emb.weight has rows of 192 values", p("q.gguf")),
        ("zoo member for an engine without the hf, gguf or onnx format",
         ["conform", "--engine", "/usr/bin/python3 " + os.path.join(HERE, "..", "..", "engines", "reference", "python_reference.py"), "--model", "zoo:llama",
          "--checks", "tokens"], "none of \"hf\", \"gguf\", \"onnx\"", None),
    ]


def main(tinygpt, work):
    os.makedirs(work, exist_ok=True)
    make_files(work)
    failures = []
    rows = cases(work, None)
    for name, args, expect, must_not_exist in rows:
        r = subprocess.run([tinygpt] + args, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        err_lines = [l for l in r.stderr.splitlines() if l.strip()]
        errors = [l for l in err_lines if l.startswith("tinygpt: error: ")]
        problems = []
        if r.returncode != 2:
            problems.append("exit %d, expected 2" % r.returncode)
        if len(errors) != 1:
            problems.append("%d error lines, expected 1" % len(errors))
        elif expect not in errors[0]:
            problems.append("the error does not name %r" % expect)
        bad = [w for w in FORBIDDEN if w in r.stderr + r.stdout]
        if bad:
            problems.append("output shows %s" % ", ".join(bad))
        if must_not_exist and os.path.exists(must_not_exist):
            problems.append("left %s behind" % must_not_exist)
        line = errors[0][len("tinygpt: error: "):] if errors else (err_lines[-1] if err_lines else "(no stderr)")
        print("%-4s %-42s %s" % ("ok" if not problems else "FAIL", name, line[:150]))
        if problems:
            failures.append("%s: %s\n  stderr: %s" % (name, "; ".join(problems), r.stderr.strip()[:800]))
    # Not an error: a prompt longer than the context is cut to its last `context` ids (SPEC 4), and said.
    r = subprocess.run([tinygpt, "generate", "--checkpoint", os.path.join(work, "good.pt"), "--ids", "1,2,3,4,5,6,7",
                        "--tokens", "2"], capture_output=True, text=True, timeout=300)
    said = r.returncode == 0 and "context" in r.stderr
    print("%-4s %-42s %s" % ("ok" if said else "FAIL", "prompt longer than the context (exit 0)", r.stderr.strip()[:150]))
    if not said:
        failures.append("long prompt: exit %d, stderr %r (expected exit 0 and a note naming the context)" % (r.returncode, r.stderr))
    print("%d of %d bad inputs refused cleanly" % (len(rows) - len(failures), len(rows)))
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
