#!/usr/bin/env python3
"""A fault the model cannot show is said so (docs/checks.md, "Faults a model cannot show"): transformers
writes a fresh Qwen3 directory (random weights, QK-norm weights ones, tied embeddings, bfloat16, a
byte-level tokenizer.json) and the same model with unequal QK-norm weights (tests/zoo/qwen3_user_dirs.py,
in the forky chroot). `tinygpt verify --checkpoint DIR` must pass on both: on the first with
qk-norm-after-rope not observable (its reason named, its cells n/o, the JSON's observable false), on the
second with it caught - and our greedy ids must be transformers' on both (the model is right).

Usage: qk_norm_observable.py TINYGPT WORK_DIR      exit 0 pass, 1 fail, 77 without the forky chroot
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo_common import SKIP, transformers_answer  # noqa: E402

FAULT = "qk-norm-after-rope"


def verify(tinygpt, d, report, failures):
    run = subprocess.run([tinygpt, "verify", "--checkpoint", d, "--tokens", "80", "--threads", "1", "--json", report],
                         capture_output=True, text=True)
    if run.returncode != 0:
        failures.append("%s: verify exited %d:\n%s" % (os.path.basename(d), run.returncode, (run.stdout + run.stderr)[-2000:]))
        return None, run.stdout
    with open(report) as f:
        return json.load(f), run.stdout


def greedy(tinygpt, d, ids, n):
    run = subprocess.run([tinygpt, "generate", "--checkpoint", d, "--ids", ",".join(map(str, ids)), "--tokens", str(n),
                          "--stop", "none"], capture_output=True, text=True)
    if run.returncode != 0:
        return None, run.stderr.strip()[-300:]
    return [int(x) for x in run.stdout.strip().splitlines()[-1].split(",")], ""


def main(tinygpt, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    made = tempfile.mkdtemp(prefix="tinygpt-qwen3-")  # the chroot sees the temporary folder, not the build's
    try:
        doc = transformers_answer("qwen3_user_dirs.py", made)
        if isinstance(doc, str):
            print("qk_norm_observable: skipped: " + doc)
            return SKIP
        for name in ("equal", "unequal"):
            shutil.move(os.path.join(made, name), os.path.join(work, name))
    finally:
        shutil.rmtree(made, ignore_errors=True)
    failures = []
    for name, observable in (("equal", False), ("unequal", True)):
        d = os.path.join(work, name)
        ours, why = greedy(tinygpt, d, doc[name]["ids"], len(doc[name]["greedy"]))
        if ours != doc[name]["greedy"]:
            failures.append("%s: our greedy ids %s, transformers' %s %s" % (name, ours, doc[name]["greedy"], why))
        rep, out = verify(tinygpt, d, os.path.join(work, name + ".json"), failures)
        if rep is None:
            continue
        faults = {f["fault"]: f for f in rep["fault_matrix"]["faults"]}
        f = faults.get(FAULT)
        row = next((c for c in rep["checks"] if c["check"] == "fault-matrix"), None)
        if f is None or row is None:
            failures.append("%s: no %s in the matrix, or no fault-matrix row" % (name, FAULT))
            continue
        if f["observable"] != observable:
            failures.append("%s: %s observable %s, expected %s (effect %s, noise %s)" % (name, FAULT, f["observable"], observable,
                                                                                         f.get("effect"), f.get("noise")))
        if observable:
            if not f["caught"] or f["missed_expected"]:
                failures.append("%s: %s observable but not caught by its rows: %s" % (name, FAULT, f["missed_expected"]))
            if "not observable" in row["figure"]:
                failures.append("%s: the matrix row says a fault is not observable: %s" % (name, row["figure"]))
        else:
            says = FAULT + " not observable on this model"
            if says not in row["figure"] or "QK-norm weights are equal" not in row["figure"]:
                failures.append("%s: the matrix row does not say '%s' with its reason: %s" % (name, says, row["figure"]))
            if "QK-norm weights are equal" not in (f.get("not_observable_why") or ""):
                failures.append("%s: not_observable_why: %r" % (name, f.get("not_observable_why")))
            if not (f["effect"] <= 4 * f["noise"]):
                failures.append("%s: effect %s over 4x the noise %s" % (name, f["effect"], f["noise"]))
            cells = next(r["cells"] for r in rep["fault_matrix"]["matrix"]["rows"] if r["fault"] == FAULT)
            if set(cells) - {"n/o", "not run"}:
                failures.append("%s: its cells %s, expected n/o" % (name, cells))
            if (FAULT + ": not observable on this model") not in out:
                failures.append("%s: the console matrix does not name it not observable" % name)
        print("qk_norm_observable: %s: %s observable=%s effect=%s noise=%s; fault-matrix %s: %s"
              % (name, FAULT, f["observable"], f.get("effect"), f.get("noise"), row["status"], row["figure"][:160]))
    for x in failures:
        print("FAIL " + x)
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
