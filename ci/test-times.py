#!/usr/bin/env python3
"""What the test suite cost: the slowest tests, each with its wall and CPU seconds, the sum per label,
and the tests over the budget without a reason. Read from the last ctest run in BUILD_DIR:
build/test-times/*.json (tests/timed.py: wall and CPU seconds of every test), the test list with its
labels and properties (`ctest --show-only=json-v1`) and the JUnit report (each test's status).

  ci/test-times.py [BUILD_DIR] [--top 30] [--markdown] [--wall SECONDS] [--budget 120] [--json FILE]
  ci/test-times.py --from FILE [...]      the same tables from an earlier run's --json

--wall: the whole command's wall time, printed beside the tests' sums. --budget: a test that ran
longer needs a reason in its CMake line (the test property TINYGPT_SLOW_REASON, set with
tinygpt_slow_test()); such tests without one are listed and the script exits 1. --json: everything
above as one document (docs/perf.md's tables are made from it).
"""
import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET


def ctest_list(build):
    # ctest --show-only rewrites Testing/Temporary/LastTest.log: the last run's log is kept as it was.
    log = os.path.join(build, "Testing", "Temporary", "LastTest.log")
    kept = open(log, "rb").read() if os.path.exists(log) else None
    try:
        out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True, text=True, check=True).stdout
    finally:
        if kept is not None:
            open(log, "wb").write(kept)
    tests = {}
    for t in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        tests[t["name"]] = {"labels": labels if isinstance(labels, list) else [labels]}
    return tests


def reasons(build):
    # tinygpt_slow_test() writes "name<TAB>reason" lines at configure time.
    path = os.path.join(build, "test-slow-reasons.txt")
    if not os.path.exists(path):
        return {}
    out = {}
    for line in open(path):
        name, _, why = line.rstrip("\n").partition("\t")
        out[name] = why
    return out


def junit(build):
    path = os.path.join(build, "test-results.xml")
    if not os.path.exists(path):
        return {}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        status = case.get("status", "")
        if case.find("failure") is not None:
            status = "failed"
        elif case.find("skipped") is not None:
            status = "skipped"
        out[case.get("name")] = {"status": status, "time": float(case.get("time") or 0)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--wall", type=float)
    ap.add_argument("--budget", type=float, default=120)
    ap.add_argument("--json")
    ap.add_argument("--from", dest="source")
    a = ap.parse_args()

    if a.source:
        saved = json.load(open(a.source))
        return report(a, saved["tests"], saved.get("wall_s") if a.wall is None else a.wall)
    listed = ctest_list(a.build)
    why = reasons(a.build)
    results = junit(a.build)
    times_dir = os.path.join(a.build, "test-times")
    rows = []
    for name, info in listed.items():
        path = os.path.join(times_dir, name.replace("/", "_") + ".json")
        rec = json.load(open(path)) if os.path.exists(path) else None
        res = results.get(name, {})
        if rec is None and not res:
            continue  # not run this time (a label or -R selected others)
        wall = rec["wall_s"] if rec else res.get("time", 0.0)
        cpu = rec["cpu_s"] if rec else None
        rows.append({"name": name, "labels": info["labels"], "wall_s": wall, "cpu_s": cpu,
                     "status": res.get("status", "?"), "reason": why.get(name, "")})
    if not rows:
        sys.exit("test-times: no test of %s has run (run ctest there first)" % a.build)
    return report(a, rows, a.wall)


def report(a, rows, wall):
    rows.sort(key=lambda r: -r["wall_s"])
    labels = {}
    for r in rows:
        for lab in r["labels"] or ["(none)"]:
            s = labels.setdefault(lab, {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0})
            s["tests"] += 1
            s["wall_s"] += r["wall_s"]
            s["cpu_s"] += r["cpu_s"] or 0.0
    total = {"tests": len(rows), "wall_s": sum(r["wall_s"] for r in rows),
             "cpu_s": sum(r["cpu_s"] or 0.0 for r in rows)}
    over = [r for r in rows if r["wall_s"] > a.budget and not r["reason"]]

    fmt = (lambda cells: "| " + " | ".join(cells) + " |") if a.markdown else (lambda cells: "  ".join(cells))
    print("The %d slowest of %d tests (wall and CPU seconds; status from the JUnit report):" % (min(a.top, len(rows)), len(rows)))
    if a.markdown:
        print()
        print(fmt(["test", "wall s", "CPU s", "labels", "status"]))
        print(fmt(["---", "---:", "---:", "---", "---"]))
    for r in rows[:a.top]:
        cpu = "%.1f" % r["cpu_s"] if r["cpu_s"] is not None else "-"
        if a.markdown:
            print(fmt([r["name"], "%.1f" % r["wall_s"], cpu, ",".join(r["labels"]), r["status"]]))
        else:
            print("  %-70s %8.1f %8s  %s" % (r["name"], r["wall_s"], cpu, ",".join(r["labels"])))
    print()
    print("By label (a test with several labels counts in each):")
    if a.markdown:
        print()
        print(fmt(["label", "tests", "wall s", "CPU s"]))
        print(fmt(["---", "---:", "---:", "---:"]))
    for lab, s in sorted(labels.items(), key=lambda kv: -kv[1]["wall_s"]):
        if a.markdown:
            print(fmt([lab, str(s["tests"]), "%.0f" % s["wall_s"], "%.0f" % s["cpu_s"]]))
        else:
            print("  %-24s %4d tests %8.0f s wall %8.0f s CPU" % (lab, s["tests"], s["wall_s"], s["cpu_s"]))
    line = "All %d tests: %.0f s of test wall time, %.0f CPU-s" % (total["tests"], total["wall_s"], total["cpu_s"])
    if wall is not None:
        line += "; the whole command %.0f s (%d min %02d s)" % (wall, wall // 60, wall % 60)
    print()
    print(line)
    if over:
        print()
        print("Over the %.0f s budget with no reason in its CMake line (tinygpt_slow_test):" % a.budget)
        for r in over:
            print("  %s: %.1f s" % (r["name"], r["wall_s"]))
    if a.json:
        json.dump({"tests": rows, "labels": labels, "total": total, "wall_s": wall, "budget_s": a.budget,
                   "over_budget": [r["name"] for r in over]}, open(a.json, "w"), indent=1)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
