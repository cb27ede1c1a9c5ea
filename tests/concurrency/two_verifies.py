#!/usr/bin/env python3
"""No hidden shared state between processes: `tinygpt verify` run alone, then
two `tinygpt verify` processes started together in one working folder, give the same results:
every check's verdict and key figure, and the fault matrix to the last digit. Only the timings may
differ. Nothing is left behind in the folder but the reports and logs.

  two_verifies.py TINYGPT WORK_DIR [verify options...]
"""
import json
import os
import shutil
import subprocess
import sys


def strip_times(x):
    if isinstance(x, dict):
        return {k: strip_times(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, list):
        return [strip_times(v) for v in x]
    return x


def main():
    tinygpt, work, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cmd = [tinygpt, "verify"] + extra

    def start(name):
        log = open(os.path.join(work, name + ".log"), "w")
        return subprocess.Popen(cmd + ["--json", os.path.join(work, name + ".json")], cwd=work, stdout=log, stderr=log)

    alone = start("alone")
    if alone.wait() != 0:
        sys.exit(f"two-verifies: verify alone failed (exit {alone.returncode}); see {work}/alone.log")
    procs = [start("first"), start("second")]
    codes = [p.wait() for p in procs]
    if codes != [0, 0]:
        sys.exit(f"two-verifies: verify run twice at once exited {codes}; see {work}/first.log and second.log")
    docs = {n: strip_times(json.load(open(os.path.join(work, n + ".json")))) for n in ("alone", "first", "second")}
    bad = [n for n in ("first", "second") if docs[n] != docs["alone"]]
    for n in bad:
        for a, b in zip(docs["alone"]["checks"], docs[n]["checks"]):
            if a != b:
                print(f"two-verifies: {n}: {b['check']}: '{b['figure']}' alone: '{a['figure']}'")
    if bad:
        sys.exit(f"two-verifies: FAIL: {', '.join(bad)} differ from the run alone")
    left = sorted(set(os.listdir(work)) - {f"{n}.{e}" for n in ("alone", "first", "second") for e in ("json", "log")})
    if left:
        sys.exit(f"two-verifies: FAIL: files left behind in the working folder: {left}")
    if "--checks" in extra:  # verify --checks: the controls ran those rows alone, in the table's order
        want = extra[extra.index("--checks") + 1].split(",")
        for c in docs["alone"]["fault_matrix"]["controls"]:
            got = [x["name"] for x in c["checks"]]
            if sorted(got) != sorted(want):
                sys.exit(f"two-verifies: FAIL: --checks {','.join(want)} ran {got} on {c['cache']}")
        faults = [f["fault"] for f in docs["alone"]["fault_matrix"]["faults"]]
        if "rows-mixed" in faults:
            sys.exit("two-verifies: FAIL: rows-mixed ran although batch, the row that catches it, was not selected")
    n = len(docs["alone"]["checks"])
    print(f"two-verifies: {n} checks and the fault matrix identical alone and with two processes at once")


if __name__ == "__main__":
    main()
