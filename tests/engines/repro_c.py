#!/usr/bin/env python3
"""repro.c tells llama.cpp's bugs from the adapter's: a bundle of `conform --repro` on a planted fault of the
llama.cpp adapter, written as a C program by engines/llama.cpp/repro_c.py, built and run.

  - a fault in the adapter's calls (rollback-forgets-the-window: a rollback that never copies the evicted
    cells back) is in the trace, so repro.c fails at the same request as repro.py;
  - a fault in the file the adapter hands llama.cpp (kv-heads-interleaved: the GGUF rewritten before it is
    loaded) is not: repro.c loads the bundle's model and passes where repro.py fails.

usage: repro_c.py TINYGPT PROJECT_ROOT ADAPTER
"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    tinygpt, root, adapter = sys.argv[1:]
    tool = os.path.join(root, "engines", "llama.cpp", "repro_c.py")
    cases = [  # fault, conform arguments, the row, repro.c's exit
        ("rollback-forgets-the-window", ["--checks", "rollback"], "rollback", 1),
        ("kv-heads-interleaved", ["--model", "zoo:llama", "--checks", "logits", "--tokens", "40"], "logits", 0),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for fault, args, row, want in cases:
            env = dict(os.environ, TINYGPT_ENGINE_FAULT=fault)
            out = os.path.join(tmp, fault)
            run = subprocess.run([tinygpt, "conform", "--engine", adapter, "--threads", "1", "--repro", out] + args,
                                 env=env, cwd=root, capture_output=True, text=True)
            if run.returncode != 1:
                sys.exit("FAIL: conform exited %d on %s, not 1\n%s" % (run.returncode, fault, run.stderr[-2000:]))
            bundle = os.path.join(out, row)
            spec = json.load(open(os.path.join(bundle, "requests.json")))
            write = subprocess.run([sys.executable, tool, "write", bundle, "--adapter", adapter], env=env, capture_output=True, text=True)
            sys.stdout.write(write.stdout)
            if write.returncode != 0:
                sys.exit("FAIL: repro_c.py write on %s exited %d\n%s" % (fault, write.returncode, write.stderr[-2000:]))
            for f in ("repro.c", "expected.h"):
                if not os.path.isfile(os.path.join(bundle, f)):
                    sys.exit("FAIL: the bundle of %s has no %s" % (fault, f))
            report = open(os.path.join(bundle, "REPORT.md")).read()
            if "## Without the adapter: `repro.c`" not in report or "cc -O2" not in report:
                sys.exit("FAIL: REPORT.md of %s does not say how to build repro.c" % fault)
            c = subprocess.run([sys.executable, tool, "run", bundle, "--adapter", adapter], capture_output=True, text=True)
            last = c.stdout.strip().splitlines()[-1] if c.stdout.strip() else c.stderr[-300:]
            print("%s: repro.c exits %d: %s" % (fault, c.returncode, last))
            if c.returncode != want:
                sys.exit("FAIL: repro.c exited %d on %s, not %d\n%s%s" % (c.returncode, fault, want, c.stdout[-2000:], c.stderr[-2000:]))
            at = "FAIL request %d of %d" % (spec["failure"]["request"], len(spec["steps"]))
            if want == 1 and at not in c.stdout:
                sys.exit("FAIL: repro.c on %s fails elsewhere than repro.py (%s)" % (fault, at))
    print("PASS")


if __name__ == "__main__":
    main()
