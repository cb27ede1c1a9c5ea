#!/usr/bin/env python3
"""Runs `tinygpt conform` on an engine variant and checks which rows failed, by name: a verdict is
only useful if it points at the right check. Usage:
  expect_rows.py TINYGPT WORK_DIR --exactly a,b | --includes a,b | --none  [--skipped a,b] [--passed a,b]
                 [--says ROW=TEXT]... [--past-window true|false] [--diagnosis F|none] [--diagnosis-says TEXT] -- CONFORM ARGS...
--exactly: the failed rows are exactly these; --includes: these are among them (others may fail too);
--none: no row fails (exit 0); --skipped: these rows are reported as skipped (declared deviations);
--passed: these rows ran and passed (whatever else the run did);
--says: row ROW's detail contains TEXT (why it was skipped, what it judged);
--past-window: the report says the run went past the window (true) or was kept inside it (false);
--diagnosis: the run's diagnosis (conform --diagnose) names fault F first, or says no known fault matches;
--diagnosis-says: its text contains TEXT.

One conform run several tests assert on (a ctest fixture: the run is the costly part):
  expect_rows.py TINYGPT WORK_DIR --run-only -- CONFORM ARGS...     runs it, keeps WORK_DIR/conform.json and
                                                                    its exit status; fails only when no
                                                                    report was written
  expect_rows.py TINYGPT WORK_DIR --from RUN_DIR EXPECTATIONS...     the expectations on that run's report
"""
import json
import os
import subprocess
import sys


def main():
    args = sys.argv[1:]
    tinygpt, work = args[0], args[1]
    split = args.index("--") if "--" in args else len(args)
    opts, conform = args[2:split], args[split + 1:]
    mode, names, skipped, diagnosis, says, past_window, passed, run_only, source = None, [], [], None, [], None, [], False, None
    diagnosis_says = None
    i = 0
    while i < len(opts):
        if opts[i] in ("--exactly", "--includes"):
            mode, names = opts[i], [n for n in opts[i + 1].split(",") if n]
            i += 2
        elif opts[i] == "--none":
            mode = "--none"
            i += 1
        elif opts[i] == "--diagnosis":
            diagnosis = opts[i + 1]
            i += 2
        elif opts[i] == "--diagnosis-says":
            diagnosis_says = opts[i + 1]
            i += 2
        elif opts[i] == "--past-window":
            past_window = {"true": True, "false": False}[opts[i + 1]]
            i += 2
        elif opts[i] == "--says":
            row, _, text = opts[i + 1].partition("=")
            says.append((row, text))
            i += 2
        elif opts[i] == "--skipped":
            skipped = [n for n in opts[i + 1].split(",") if n]
            i += 2
        elif opts[i] == "--passed":
            passed = [n for n in opts[i + 1].split(",") if n]
            i += 2
        elif opts[i] == "--run-only":
            run_only = True
            i += 1
        elif opts[i] == "--from":
            source = opts[i + 1]
            i += 2
        else:
            sys.exit("expect_rows.py: unknown option %r" % opts[i])
    if source is not None:  # the report of a run made once for several tests
        report = os.path.join(source, "conform.json")
        if not os.path.exists(report):
            print("FAIL: no report at %s (its run did not write one)" % report)
            return 1
        returncode = int(open(os.path.join(source, "exit-status")).read())
        print("the report of one run: %s (exit %d)" % (report, returncode))
    else:
        os.makedirs(work, exist_ok=True)
        report = os.path.join(work, "conform.json")
        status = os.path.join(work, "exit-status")
        for f in (report, status):
            if os.path.exists(f):
                os.remove(f)
        r = subprocess.run([tinygpt, "conform", "--json", report] + conform, capture_output=True, text=True, timeout=1200)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr[-4000:])
        if not os.path.exists(report):
            print("FAIL: no JSON report (exit %d)" % r.returncode)
            return 1
        returncode = r.returncode
        open(status, "w").write(str(returncode))
        if run_only:
            print("run kept for the tests that read it: %s (exit %d)" % (report, returncode))
            return 0
    doc = json.load(open(report))
    failed = sorted(c["check"] for c in doc["checks"] if c["status"] in ("fail", "error"))
    skip = sorted(c["check"] for c in doc["checks"] if c["status"] == "skipped")
    problems = []
    if mode == "--none" and (failed or returncode != 0):
        problems.append("expected no failed row and exit 0, got %s (exit %d)" % (failed, returncode))
    if mode == "--exactly" and failed != sorted(names):
        problems.append("expected exactly %s to fail, got %s" % (sorted(names), failed))
    if mode == "--includes" and not set(names) <= set(failed):
        problems.append("expected %s among the failed rows, got %s" % (sorted(names), failed))
    if mode in ("--exactly", "--includes") and returncode != 1:
        problems.append("expected exit 1, got %d" % returncode)
    status_of = {c["check"]: c["status"] for c in doc["checks"]}
    for n in passed:
        if status_of.get(n) != "pass":
            problems.append("expected %s to pass, got %s" % (n, status_of.get(n, "no such row")))
    for n in skipped:
        if n not in skip:
            problems.append("expected %s to be reported as skipped (declared), got %s" % (n, skip))
    if past_window is not None and doc.get("past_window") != past_window:
        problems.append("expected the report's past_window to be %s, got %s" % (past_window, doc.get("past_window")))
    details = {c["check"]: c.get("figure") or "" for c in doc["checks"]}
    for row, text in says:
        if text not in details.get(row, ""):
            problems.append("expected row %s to say %r, it says %r" % (row, text, details.get(row)))
    if diagnosis is not None:
        d = doc.get("diagnosis")
        if not d:
            problems.append("expected a diagnosis in the report, got none")
        elif diagnosis == "none" and (d["matches"] or "match no known fault" not in d["text"]):
            problems.append("expected no known fault to match, got %s: %s" % (d["matches"], d["text"]))
        elif diagnosis == "none" and not all(("%s: after " % row) in d.get("saw", "") or ("%s: a plain step" % row) in d.get("saw", "")
                                             for row in d["failing"]):
            # "No known fault" says what it saw: each failing row's operation (or a plain step) and where.
            problems.append("'no known fault' does not say what each failing row showed: %r" % d.get("saw"))
        elif diagnosis != "none" and (not d["matches"] or d["matches"][0] != diagnosis):
            problems.append("expected the diagnosis to name %s first, got %s: %s" % (diagnosis, d["matches"], d["text"]))
        elif diagnosis_says is not None and diagnosis_says not in d["text"]:
            problems.append("expected the diagnosis to say %r: %s" % (diagnosis_says, d["text"]))
        else:
            print("diagnosis: " + d["text"])
    for p in problems:
        print("FAIL: " + p)
    print("failed rows: %s; skipped rows: %s" % (failed, skip))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
