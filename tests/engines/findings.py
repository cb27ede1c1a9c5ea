#!/usr/bin/env python3
"""Replays one docs/findings/ bundle against an engine: writes the model with the bundle's export command
into a copy of the folder, runs its repro.py with --engine, and passes while the finding is there (repro.py
exits 1, naming the same request). Fails when the engine answers right (a fix: the finding's docs are
stale) or cannot run the bundle.

usage: findings.py TINYGPT PROJECT_ROOT FINDING ENGINE
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    tinygpt, root, finding, engine = sys.argv[1:]
    src = os.path.join(root, "docs", "findings", finding)
    with tempfile.TemporaryDirectory() as tmp:
        here = os.path.join(tmp, finding)
        shutil.copytree(src, here)
        spec = json.load(open(os.path.join(here, "requests.json")))
        export = shlex.split(spec["export"])
        assert export[0] == "tinygpt", export
        out = export.index(spec["load"]["checkpoint"])
        export[out] = os.path.join(here, export[out])
        run = subprocess.run([tinygpt] + export[1:], cwd=root, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit("FAIL: the export command failed: %s" % run.stderr[-1000:])
        rep = subprocess.run([sys.executable, os.path.join(here, "repro.py"), "--engine", engine], cwd=tmp, capture_output=True, text=True)
        sys.stdout.write(rep.stdout)
        want = "FAIL request %d of %d" % (spec["failure"]["request"], len(spec["steps"]))
        if rep.returncode == 0:
            sys.exit("FAIL: the engine answers every request of %s right: the finding is fixed, its report is stale" % finding)
        if rep.returncode != 1 or want not in rep.stdout:
            sys.exit("FAIL: repro.py exited %d without '%s'\n%s" % (rep.returncode, want, rep.stderr[-2000:]))
    print("PASS: %s still reproduces" % finding)


if __name__ == "__main__":
    main()
