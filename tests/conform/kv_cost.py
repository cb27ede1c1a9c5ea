#!/usr/bin/env python3
"""conform's KV-type cost on llama.cpp: `--kv-type q8_0 --kv-compare f16,q4_0` judges each type by the
budget against the same engine with an f32 cache, and the reports show each type per position.
Usage: kv_cost.py TINYGPT ENGINE WORK_DIR
Asserts: exit 1 (q4_0 is over the budget), `kv-budget [q8_0]` and `[f16]` pass and `[q4_0]` fails naming
the first position over it; the JSON has each type's per-step KL and top-1 against the f32 baseline and
our model; the HTML has a plot per type; the Markdown a per-position table per type. Then every row
under q8_0 and q4_0 reports its cost against the f32 engine and is judged by the budget."""
import json
import os
import subprocess
import sys


def main():
    tinygpt, engine, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    paths = {k: os.path.join(work, "kv." + k) for k in ("json", "html", "md")}
    for p in paths.values():
        if os.path.exists(p):
            os.remove(p)
    cmd = [tinygpt, "conform", "--engine", engine, "--kv-type", "q8_0", "--kv-compare", "f16,q4_0", "--kv-budget", "3e-5",
           "--max-kl", "3e-5", "--checks", "teacher-forced", "--threads", "1", "--json", paths["json"], "--html", paths["html"],
           "--markdown", paths["md"]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr[-3000:])
    problems = []
    if r.returncode != 1:
        problems.append("expected exit 1 (q4_0 over the budget), got %d" % r.returncode)
    doc = json.load(open(paths["json"]))
    rows = {c["check"]: c for c in doc["checks"]}
    for t, want in (("q8_0", "pass"), ("f16", "pass"), ("q4_0", "fail")):
        row = rows.get("kv-budget [%s]" % t)
        if row is None or row["status"] != want:
            problems.append("kv-budget [%s]: expected %s, got %s" % (t, want, row and row["status"]))
    q4 = rows.get("kv-budget [q4_0]", {})
    if "first step over it at position" not in q4.get("figure", ""):  # a row's text is its "figure"
        problems.append("the q4_0 row must name the first position over the budget: %r" % q4.get("figure"))
    costs = {k["kv_type"]: k for k in doc.get("kv_cost", [])}
    if sorted(costs) != ["f16", "q4_0", "q8_0"]:
        problems.append("kv_cost types: %s" % sorted(costs))
    for t, k in costs.items():
        if k["baseline"] != "f32":
            problems.append("%s: baseline %r, expected the engine's f32 cache" % (t, k["baseline"]))
        for ref in ("vs_baseline", "vs_model"):
            n = len(k[ref]["per_step_kl"])
            if n < 500 or len(k[ref]["per_step_top1"]) != n:
                problems.append("%s %s: %d per-step KL values" % (t, ref, n))
    if costs and not (costs["f16"]["vs_baseline"]["kl_mean"] < costs["q8_0"]["vs_baseline"]["kl_mean"] <
                      costs["q4_0"]["vs_baseline"]["kl_mean"]):
        problems.append("expected f16 < q8_0 < q4_0 in mean KL against f32: %s" %
                        {t: k["vs_baseline"]["kl_mean"] for t, k in costs.items()})
    html = open(paths["html"]).read()
    for t in ("q8_0", "f16", "q4_0"):
        if 'id="kv-%s"' % t not in html:
            problems.append("no plot for %s in the HTML report" % t)
    md = open(paths["md"]).read()
    if "What each KV cache or weight type costs, per position" not in md or "| positions | mean KL |" not in md:
        problems.append("no per-position KV table in the Markdown report")
    # Every row under a type is also sent to the same engine with an f32 cache: each row reports what
    # the type costs against it, and is judged by the budget (q8_0 inside 3e-5, q4_0 outside).
    rows_checks = "ragged,fork"
    for t, want in (("q8_0", "pass"), ("q4_0", "fail")):
        out = os.path.join(work, "rows-%s.json" % t)
        r = subprocess.run([tinygpt, "conform", "--engine", engine, "--kv-type", t, "--kv-budget", "3e-5", "--max-kl", "1",
                            "--checks", rows_checks, "--threads", "1", "--json", out], capture_output=True, text=True, timeout=900)
        sys.stderr.write(r.stderr[-1500:])
        doc = json.load(open(out))
        for name in rows_checks.split(","):
            row = next((c for c in doc["checks"] if c["check"] == name), None)
            if row is None:
                problems.append("%s: no %s row" % (t, name))
                continue
            kl = row.get("stats", {}).get("kl_mean_vs_f32_cache")
            if kl is None:
                problems.append("%s %s: no kl_mean_vs_f32_cache in its stats" % (t, name))
            if row["status"] != want:
                problems.append("%s %s: expected %s, got %s (%s)" % (t, name, want, row["status"], row["figure"][:200]))
            if want == "fail" and "KV budget" not in row["figure"]:
                problems.append("%s %s: the failure must name the KV budget: %s" % (t, name, row["figure"][:200]))
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        print("PASS: " + ", ".join("%s %.2e" % (t, k["vs_baseline"]["kl_mean"]) for t, k in sorted(costs.items())))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
