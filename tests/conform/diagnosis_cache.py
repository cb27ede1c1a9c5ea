#!/usr/bin/env python3
"""The diagnosis a run gives from a fresh cache is the one it gives from the cache it wrote: the
catalogue's fault runs on our model are kept beside the references (TINYGPT_REFERENCE_CACHE), and a
run that reads them back must match the engine to the same fault. Usage:
  diagnosis_cache.py TINYGPT WORK_DIR -- CONFORM ARGS...   (ARGS include --diagnose; the engine's fault is
                                                              set in the environment by the caller)
"""
import glob
import json
import os
import shutil
import subprocess
import sys


def main():
    args = sys.argv[1:]
    split = args.index("--")
    tinygpt, work, conform = args[0], args[1], args[split + 1:]
    shutil.rmtree(work, ignore_errors=True)
    cache = os.path.join(work, "cache")
    os.makedirs(cache)
    env = dict(os.environ, TINYGPT_REFERENCE_CACHE=cache)
    got = []
    for run in ("fresh", "cached"):
        out = os.path.join(work, run + ".json")
        p = subprocess.run([tinygpt, "conform", *conform, "--json", out], env=env, capture_output=True, text=True)
        if not os.path.exists(out):
            sys.exit(f"{run} run wrote no report (exit {p.returncode}): {p.stderr[-2000:]}")
        with open(out) as f:
            d = json.load(f).get("diagnosis")
        if not d:
            sys.exit(f"{run} run has no diagnosis (exit {p.returncode})")
        got.append(d)
        if run == "fresh":
            kept = glob.glob(os.path.join(cache, "diagnosis-*.json"))
            if not kept:
                sys.exit("the fresh run kept no fault run in the cache: " + ", ".join(os.listdir(cache)))
    fresh, cached = got
    if not fresh.get("matches"):
        sys.exit("the fresh run names no fault: " + fresh.get("text", ""))
    if fresh != cached:
        sys.exit("the diagnosis from the cache differs:\n  fresh:  " + json.dumps(fresh) + "\n  cached: " + json.dumps(cached))
    print("both runs: " + fresh["text"])


if __name__ == "__main__":
    main()
