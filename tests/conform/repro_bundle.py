#!/usr/bin/env python3
"""conform --repro on a planted engine fault: every failing row gets a bundle, the bundle's repro.py fails
on the faulty engine (exit 1) and passes on the correct one (exit 0), and the shrunk sequence is at most a
tenth of the row's requests, or 4 where a tenth is fewer (a reset, a prefill, one operation and the wrong
answer: the least a failing operation takes).

usage: repro_bundle.py TINYGPT ENGINE FAULT [--ratio-json FILE [--engine-name NAME]] [--repro-c REPRO_C_PY] -- CONFORM_ARGS...
  ENGINE the engine's command line; FAULT its TINYGPT_ENGINE_FAULT. --ratio-json appends the row's
  figures (engine name, fault, row, requests before and after, seconds) to FILE, one JSON object per line.
  --repro-c (ENGINE the llama.cpp adapter): each bundle also written as repro.c by REPRO_C_PY from the
  faulty adapter's calls and from the correct one's, each built and run; their exits join the figures
  (a fault in the calls: 1 and 0; in the file the adapter loads: 0 and 0). The correct calls must pass.
"""
import json
import os
import re
import subprocess
import sys
import tempfile


def main():
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") < 3:
        sys.exit(__doc__)
    sep = argv.index("--")
    tinygpt, engine, fault = argv[:3]
    ratio_json = None
    if "--ratio-json" in argv[3:sep]:
        ratio_json = argv[argv.index("--ratio-json") + 1]
    engine_name = argv[argv.index("--engine-name") + 1] if "--engine-name" in argv[3:sep] else engine
    repro_c = argv[argv.index("--repro-c") + 1] if "--repro-c" in argv[3:sep] else None
    conform_args = argv[sep + 1:]
    with tempfile.TemporaryDirectory() as tmp:
        bundles, report = os.path.join(tmp, "bundles"), os.path.join(tmp, "report.json")
        faulty = dict(os.environ, TINYGPT_ENGINE_FAULT=fault)
        run = subprocess.run([tinygpt, "conform", "--engine", engine, "--repro", bundles, "--json", report] + conform_args,
                             env=faulty, capture_output=True, text=True)
        sys.stdout.write(run.stdout)
        if run.returncode != 1:
            sys.stderr.write(run.stderr[-4000:])
            sys.exit("FAIL: conform exited %d on the planted fault %s, not 1" % (run.returncode, fault))
        doc = json.load(open(report))
        failing = [r["check"] for r in doc["rows"] if r["status"] in ("fail", "error")]
        repros = {r["row"]: r for r in doc.get("repros", [])}
        if sorted(repros) != sorted(failing):
            sys.exit("FAIL: bundles for %s, failing rows %s" % (sorted(repros), sorted(failing)))
        clean = {k: v for k, v in os.environ.items() if k != "TINYGPT_ENGINE_FAULT"}
        for row, r in repros.items():
            if not r["dir"]:
                sys.exit("FAIL: row %s has no bundle: %s" % (row, r["why_not"]))
            before, after = r["requests_before"], r["requests_after"]
            print("%s %s: %d requests -> %d (%d candidates, %.1f s)" % (fault, row, before, after, r["candidates"], r["seconds"]))
            figures = {"engine": engine_name, "fault": fault, "row": row, "before": before, "after": after, "candidates": r["candidates"],
                       "seconds": round(r["seconds"], 1)}
            for f in ("requests.json", "repro.py", "REPORT.md"):
                if not os.path.isfile(os.path.join(r["dir"], f)):
                    sys.exit("FAIL: the bundle has no %s" % f)
            report_md = open(os.path.join(r["dir"], "REPORT.md")).read()
            if "the first wrong answer" not in report_md or "python3 repro.py" not in report_md:
                sys.exit("FAIL: REPORT.md does not mark the wrong answer or say how to run repro.py")
            # Replayed from another folder: the bundle carries what it needs.
            for env, want, what in ((faulty, 1, "the faulty engine"), (clean, 0, "the correct engine")):
                rep = subprocess.run([sys.executable, os.path.join(r["dir"], "repro.py")], env=env, cwd=tmp, capture_output=True, text=True)
                print("  repro.py on %s: exit %d: %s" % (what, rep.returncode, rep.stdout.strip().splitlines()[-1] if rep.stdout.strip() else rep.stderr[-300:]))
                if rep.returncode != want:
                    sys.exit("FAIL: repro.py exited %d on %s, not %d\n%s%s" % (rep.returncode, what, want, rep.stdout, rep.stderr[-2000:]))
            if repro_c:
                for env, key in ((faulty, "c_faulty"), (clean, "c_correct")):
                    w = subprocess.run([sys.executable, repro_c, "write", r["dir"], "--adapter", engine], env=env, capture_output=True, text=True)
                    m = re.search(r"repro\.c built and run: exit (\d+): (.*)", w.stdout)
                    if w.returncode != 0 or not m:
                        sys.exit("FAIL: repro_c.py write exited %d\n%s%s" % (w.returncode, w.stdout, w.stderr[-2000:]))
                    figures[key] = int(m.group(1))
                    print("  repro.c of the %s adapter's calls: exit %s: %s" % ("faulty" if key == "c_faulty" else "correct", m.group(1), m.group(2)))
                if figures["c_correct"] != 0:
                    sys.exit("FAIL: repro.c of the correct adapter's calls fails")
            if ratio_json:
                with open(ratio_json, "a") as f:
                    f.write(json.dumps(figures) + "\n")
            if after > max(before // 10, 4):
                sys.exit("FAIL: %s's bundle keeps %d of %d requests (more than a tenth)" % (row, after, before))
    print("PASS")


if __name__ == "__main__":
    main()
