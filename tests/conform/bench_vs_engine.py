"""`tinygpt bench --vs-engine` on the example engine: one run prints ours against the engine, the
JSON has every batch with both rates, their ratio and the greedy tokens of both compared (the
example engine is exact, so all of them agree); an engine without the `bench` operation, and steps
past the window, are refused with exit 2 and one line saying why.

  bench_vs_engine.py TINYGPT WORK_DIR
"""
import json
import os
import subprocess
import sys

tinygpt, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
engine = "/usr/bin/python3 " + os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "engines", "reference",
                                            "python_reference.py")
out = os.path.join(work, "vs.json")
failures = []


def run(args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([tinygpt, "bench", "--vs-engine", engine] + args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=e)


r = run(["--batch", "1,3", "--steps", "24", "--reps", "2", "--threads", "1", "--json", out])
if r.returncode != 0:
    failures.append("exit %d: %s" % (r.returncode, r.stderr[-400:]))
else:
    if "ours/engine" not in r.stdout or "python-reference" not in r.stdout:
        failures.append("the table does not name the engine and the ratio:\n" + r.stdout)
    d = json.load(open(out))
    if [row["batch"] for row in d["rows"]] != [1, 3]:
        failures.append("rows for batches %s, wanted [1, 3]" % [row["batch"] for row in d["rows"]])
    for row in d["rows"]:
        b = row["batch"]
        if len(row["ours_runs_tok_s"]) != 2 or len(row["engine_runs_tok_s"]) != 2:
            failures.append("batch %d: not 2 runs a side" % b)
        if row["ours_tok_s"] != max(row["ours_runs_tok_s"]) or row["engine_tok_s"] != max(row["engine_runs_tok_s"]):
            failures.append("batch %d: the rate is not each side's best run" % b)
        if abs(row["ratio"] - row["ours_tok_s"] / row["engine_tok_s"]) > 1e-9 * row["ratio"]:
            failures.append("batch %d: ratio %g is not ours / engine" % (b, row["ratio"]))
        if row["tokens"] != b * 25 or row["tokens_agree"] != row["tokens"]:
            failures.append("batch %d: %d of %d greedy tokens agree with the exact engine (want all %d)"
                            % (b, row["tokens_agree"], row["tokens"], b * 25))
        if not row["bound_tok_s"] > 0:
            failures.append("batch %d: no bound" % b)

r = run(["--batch", "1", "--steps", "8"], {"TINYGPT_ENGINE_PROTOCOL": "1"})
if r.returncode != 2 or "does not time its own decode" not in r.stderr:
    failures.append("a protocol-1 engine: exit %d, stderr %r (want 2, 'does not time its own decode')" % (r.returncode, r.stderr[-300:]))
r = run(["--batch", "1", "--steps", "250"])
if r.returncode != 2 or "must fit the window" not in r.stderr:
    failures.append("steps past the window: exit %d, stderr %r (want 2, 'must fit the window')" % (r.returncode, r.stderr[-300:]))

for f in failures:
    print("FAIL:", f)
print("bench --vs-engine: %s" % ("ok" if not failures else "%d failure(s)" % len(failures)))
sys.exit(1 if failures else 0)
