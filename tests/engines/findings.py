#!/usr/bin/env python3
"""Replays one docs/findings/ bundle against an engine: writes the model with the bundle's export command
into a copy of the folder, runs its repro.py with --engine, and passes while the finding is there (repro.py
exits 1, naming the same request). Where the bundle carries repro.c (llama.cpp's calls as a C program),
it is built against the libraries beside the adapter (engines/llama.cpp/repro_c.py run) and must fail at
the same request too: the bug is llama.cpp's, not the adapter's; and, where ci/engines.sh set up Debian
forky's llama.cpp 0.7 (repro_c.py run --forky), built against that release and run in the chroot, where
it must fail as well (else it says so: the finding is fixed there). A bundle of
another engine (requests.json's "engine" not the llama.cpp adapter: llama-server) is replayed against
that command, from the repository root; where it cannot be started (no forky chroot) the test skips.
Fails when the engine answers right (a fix: the finding's docs are stale) or cannot run the bundle.

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
        other = not spec["engine"].endswith("llama.cpp/adapter")
        command = os.path.join(root, spec["engine"]) if other else engine
        rep = subprocess.run([sys.executable, os.path.join(here, "repro.py"), "--engine", command], cwd=tmp, capture_output=True, text=True)
        sys.stdout.write(rep.stdout)
        if other and rep.returncode == 2:
            print("SKIP: %s could not be started here (%s)" % (spec["engine"], rep.stdout.strip().splitlines()[-1:] or rep.stderr[-300:]))
            sys.exit(77)
        want = "FAIL request %d of %d" % (spec["failure"]["request"], len(spec["steps"]))
        if rep.returncode == 0:
            sys.exit("FAIL: the engine answers every request of %s right: the finding is fixed, its report is stale" % finding)
        if rep.returncode != 1 or want not in rep.stdout:
            sys.exit("FAIL: repro.py exited %d without '%s'\n%s" % (rep.returncode, want, rep.stderr[-2000:]))
        if os.path.isfile(os.path.join(here, "repro.c")):
            tool = [sys.executable, os.path.join(root, "engines", "llama.cpp", "repro_c.py"), "run", here, "--adapter", engine]
            for what, more in [("the adapter's llama.cpp", []), ("llama.cpp 0.7 (Debian forky)", ["--forky"])]:
                c = subprocess.run(tool + more, capture_output=True, text=True)
                sys.stdout.write(c.stdout)
                if c.returncode == 77:
                    print("repro.c on %s: not run" % what)
                    continue
                if c.returncode == 0:
                    sys.exit("FAIL: repro.c passes on %s: the finding is fixed there (or the adapter's calls differ from its trace)" % what)
                if c.returncode != 1 or want not in c.stdout:
                    sys.exit("FAIL: repro.c on %s exited %d without '%s'\n%s" % (what, c.returncode, want, c.stderr[-2000:]))
                print("repro.c on %s: fails as reported" % what)
    print("PASS: %s still reproduces%s" % (finding, " (repro.py and repro.c)" if os.path.isfile(os.path.join(src, "repro.c")) else ""))


if __name__ == "__main__":
    main()
