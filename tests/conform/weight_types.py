#!/usr/bin/env python3
"""Quantized weights under conform on llama.cpp (docs/checks.md, "Quantized weights"): the adapter
quantizes the float32 GGUF with llama.cpp's own llama_model_quantize when load names "weight_type".
Usage: weight_types.py TINYGPT ENGINE WORK_DIR
Asserts:
 - `--weight-type q4_0` on the fixture: exit 0 at the 4-bit default budget (5e-2); the weight-budget
   row costs the teacher-forced run against the same engine with f32 weights and against our model
   (mean KL over 1e-4: the weights really are quantized; under the budget), every row carries its cost
   against the f32-weight engine, the report names the weight type;
 - the same at `--weight-budget 1e-4`: exit 1, the weight-budget row and the logit rows over it;
 - `--weight-type q4_K_M` on zoo:llama (width 192): refused by the tensor's name, exit 2, nothing judged;
 - a weight type the engine does not list: refused naming its hello's list, exit 2;
 - `tinygpt export --quantize q8_0` through the adapter's `--quantize`: a file about a quarter of the
   float32 one; a quantizer that fails: exit 3, nothing written."""
import json
import os
import subprocess
import sys


def run(cmd, timeout=600):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(r.stdout[-4000:])
    sys.stderr.write(r.stderr[-2000:])
    return r


def main():
    tinygpt, engine, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    problems = []
    base = [tinygpt, "conform", "--engine", engine, "--tokens", "300", "--threads", "1"]

    out = os.path.join(work, "q4_0.json")
    html = os.path.join(work, "q4_0.html")
    r = run(base + ["--weight-type", "q4_0", "--checks", "tokens,prefix-reuse", "--json", out, "--html", html])
    if r.returncode != 0:
        problems.append("q4_0 at its default budget: expected exit 0, got %d" % r.returncode)
    doc = json.load(open(out))
    rows = {c["check"]: c for c in doc["checks"]}
    w = rows.get("weight-budget [q4_0]")
    if doc.get("weight_type") != "q4_0":
        problems.append("the report must name the weight type: %r" % doc.get("weight_type"))
    if w is None or w["status"] != "pass":
        problems.append("weight-budget [q4_0]: expected pass, got %r" % (w and w["status"]))
    else:
        kl = w["stats"]["kl_mean"]
        if not 1e-4 < kl < 5e-2:
            problems.append("q4_0's mean KL against f32 weights should be over 1e-4 (quantized) and under its budget, 5e-2: %g" % kl)
        if "against the same target with f32 weights" not in w["figure"]:
            problems.append("the weight-budget row must be judged against the f32-weight engine: %r" % w["figure"])
    for name in ("tokens", "prefix-reuse"):
        stats = rows.get(name, {}).get("stats", {})
        if "kl_mean_vs_f32_weights" not in stats:
            problems.append("%s must carry its cost against the f32-weight engine: %r" % (name, sorted(stats)))
    costs = [k for k in doc.get("kv_cost", []) if k.get("kind") == "weight"]
    if len(costs) != 1 or "vs_baseline" not in costs[0]:
        problems.append("the JSON's kv_cost must hold the weight type's per-position cost against the f32 weights")
    page = open(html).read()
    if 'id="weight-q4_0"' not in page or "weights q4_0: KL per step" not in page or "same target, f32 weights" not in page:
        problems.append("the HTML report must plot the weight type's KL per position, against the f32 weights")

    out = os.path.join(work, "tight.json")
    r = run(base + ["--weight-type", "q4_0", "--weight-budget", "1e-4", "--checks", "logits", "--json", out])
    if r.returncode != 1:
        problems.append("q4_0 at a budget of 1e-4: expected exit 1, got %d" % r.returncode)
    rows = {c["check"]: c for c in json.load(open(out))["checks"]}
    for name in ("logits", "weight-budget [q4_0]"):
        if rows.get(name, {}).get("status") != "fail":
            problems.append("%s under 1e-4: expected fail, got %r" % (name, rows.get(name, {}).get("status")))

    r = run(base + ["--model", "zoo:llama", "--weight-type", "q4_K_M", "--checks", "tokens"])
    said = r.stdout + r.stderr
    if r.returncode != 2 or "token_embd.weight has rows of 192 values" not in said:
        problems.append("q4_K_M on a width of 192 must be refused by the tensor's name, exit 2: exit %d" % r.returncode)

    r = run(base + ["--weight-type", "q5_1", "--checks", "tokens"])
    if r.returncode != 2 or "weight_types" not in r.stdout + r.stderr:
        problems.append("a weight type the engine does not list must be refused naming its list, exit 2: exit %d" % r.returncode)

    # tinygpt export --quantize through the adapter's own quantizer: a q8_0 file about a quarter of the
    # float32 one, nothing else left beside it; a quantizer that fails leaves nothing (exit 3, a runtime error).
    f32, q8 = os.path.join(work, "f32.gguf"), os.path.join(work, "q8_0.gguf")
    for f in (f32, q8):
        if os.path.exists(f):
            os.remove(f)
    run([tinygpt, "export", "--format", "gguf", f32])
    r = run([tinygpt, "export", "--format", "gguf", "--quantize", "q8_0", "--quantizer", engine + " --quantize", q8])
    if r.returncode != 0 or not os.path.exists(q8) or not 0.2 < os.path.getsize(q8) / os.path.getsize(f32) < 0.35:
        problems.append("export --quantize q8_0 should write a file about a quarter of the f32 one: exit %d" % r.returncode)
    leftovers = [f for f in os.listdir(work) if f.endswith(".tmp")]
    if leftovers:
        problems.append("export --quantize left temporary files: %r" % leftovers)
    bad = os.path.join(work, "failed.gguf")
    r = run([tinygpt, "export", "--format", "gguf", "--quantize", "q4_0", "--quantizer", "false", bad])
    if r.returncode != 3 or os.path.exists(bad) or "the quantizer (false) exited 1" not in r.stderr or any(
            f.endswith(".tmp") for f in os.listdir(work)):
        problems.append("a failing quantizer must exit 3 naming it and leave nothing: exit %d" % r.returncode)

    for p in problems:
        print("FAIL: " + p)
    print("weight types: %s" % ("all assertions hold" if not problems else "%d problem(s)" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
