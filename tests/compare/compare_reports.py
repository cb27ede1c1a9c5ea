#!/usr/bin/env python3
"""`tinygpt compare OLD NEW` gates an upgrade: two runs of the same engine compare clean (exit 0);
a planted regression in a copy of a verify report (a figure 1000x worse, a fault no longer caught,
a row gone, a row that now fails) exits 1 naming each row; a margin wide enough forgives the figure
but never the verdicts; an improvement is reported as better and passes; reports of different
commands and files that are not reports exit 2.

  compare_reports.py TINYGPT VERIFY_JSON WORK_DIR ENGINE_COMMAND
"""
import copy
import json
import os
import subprocess
import sys

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def main():
    tinygpt, verify_json, work, engine = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)

    def compare(a, b, *extra):
        r = subprocess.run([tinygpt, "compare", a, b] + list(extra), capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout + r.stderr

    def write(name, doc):
        p = os.path.join(work, name)
        json.dump(doc, open(p, "w"))
        return p

    # Two runs of the same engine.
    runs = []
    for n in ("first", "second"):
        p = os.path.join(work, n + ".json")
        r = subprocess.run([tinygpt, "conform", "--engine", engine, "--checks", "tokens,logits,ragged,sampler", "--tokens", "40",
                            "--threads", "1", "--json", p], capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, "conform run %s passes (exit %d)" % (n, r.returncode))
        runs.append(p)
    rc, out = compare(*runs)
    check(rc == 0 and "no row got worse" in out, "two runs of the same engine compare clean (exit %d)\n%s" % (rc, out))

    doc = json.load(open(verify_json))
    rc, out = compare(verify_json, verify_json)
    check(rc == 0 and "0 worse" in out, "a verify report against itself: exit 0 (exit %d)" % rc)

    # A planted regression.
    bad = copy.deepcopy(doc)
    rolling = next(c for c in bad["fault_matrix"]["controls"] if c["cache"] == "rolling")
    churn = next(x for x in rolling["checks"] if x["name"] == "churn")
    churn["value"] = max(churn["value"], 1e-6) * 1000
    fault = bad["fault_matrix"]["faults"][0]
    fault["caught"] = False
    gone = bad["checks"].pop()["check"]
    flipped = bad["checks"][0]
    flipped["status"], flipped["passed"] = "fail", False
    bad_path = write("regressed.json", bad)
    rc, out = compare(verify_json, bad_path, "--json", os.path.join(work, "compare.json"))
    print(out)
    check(rc == 1, "a planted regression exits 1 (exit %d)" % rc)
    for row in ("rolling: churn", "fault: " + fault["fault"], gone, flipped["check"]):
        check(any(l.startswith("WORSE") and row in l for l in out.splitlines()), "the regression names %r" % row)
    rep = json.load(open(os.path.join(work, "compare.json")))
    check(rep["worse"] == 4 and not rep["passed"], "the JSON comparison counts 4 worse rows (%d)" % rep["worse"])

    rc, out = compare(verify_json, bad_path, "--margin", "10000", "--allow-missing")
    worse = [l for l in out.splitlines() if l.startswith("WORSE")]
    check(rc == 1 and len(worse) == 2 and not any("rolling: churn" in l for l in worse),
          "a wide margin and --allow-missing forgive the figure and the missing row, not the verdicts (%s)" % worse)

    # An improvement: the regressed report as the old one, the real one as the new.
    rc, out = compare(bad_path, verify_json, "--allow-missing")
    check(rc == 0 and any(l.startswith("better") and "rolling: churn" in l for l in out.splitlines()),
          "an improvement is better and passes (exit %d)" % rc)

    rc, out = compare(verify_json, runs[0])
    check(rc == 2 and "same command" in out, "a verify report against a conform report exits 2 (exit %d: %s)" % (rc, out.strip()))
    not_report = write("not-a-report.json", {"rows": []})
    rc, out = compare(verify_json, not_report)
    check(rc == 2 and "not a tinygpt report" in out, "a JSON file that is not a report exits 2 (exit %d)" % rc)
    broken = os.path.join(work, "broken.json")
    open(broken, "w").write("{")
    rc, out = compare(broken, verify_json)
    check(rc == 2 and "not valid JSON" in out, "a file that is not JSON exits 2 (exit %d)" % rc)

    if failures:
        sys.exit("compare: %d failure(s)" % len(failures))
    print("compare: every case behaves")


if __name__ == "__main__":
    main()
