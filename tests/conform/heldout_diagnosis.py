#!/usr/bin/env python3
"""Diagnosis from the shrunk requests on an engine the suite was never tuned on (engines/heldout/engine.py,
written from docs/protocol.md alone, its bugs under names of its own): for each planted bug, `conform
--repro DIR --diagnose` on the rows that catch it, and the faults of our catalogue that answer the bundle's
requests wrongly at the same request. The first one named must be the bug's twin in our table (below),
never another fault; at least 90% of the bugs must be named. The correct engine first passes those rows.

usage: heldout_diagnosis.py TINYGPT [BUG ...]   (no BUG: every bug)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = "/usr/bin/python3 " + os.path.join(HERE, "..", "..", "engines", "heldout", "engine.py")
# bug | the rows that catch it | our fault that is the same bug (decided from what each one does; None: no
# fault of ours is) | tokens
# (a rollback that loses what the window pushed out shows only past the window: 300)
BUGS = {
    "dirty-slot": ("join-leave,churn", "released-slot-not-reset"),
    "rewind-drops-history": ("rollback", "truncate-forgets-the-window", "300"),
    "rewind-one-short": ("rollback,churn", "truncate-off-by-one"),
    "fork-shallow": ("fork,churn", "fork-shares-storage"),
    "shift-stale-keys": ("context-shift", "shift-keys-not-rotated"),
    "shift-short-turn": ("context-shift", "shift-off-by-one"),
    "chunk-from-zero": ("chunked-prefill", "chunk-positions-restart"),
    "save-window-only": ("rollback-after-restore", "state-saved-without-history"),
    "shift-pos-unmoved": ("context-shift", "shift-position-kept"),
    "state-minus-oldest": ("save-restore", "state-saved-in-part"),
    "window-one-short": ("tokens,window-reference", "trim-before-attend", "300"),
    "step-turn-early": ("tokens,logits", "decode-pos-off-by-one"),
    "values-as-keys": ("tokens,logits", "kv-swapped"),
    "no-causal-prefill": ("tokens,logits", "prefill-no-mask"),
    "value-turned": ("tokens,logits", "rope-on-v"),
    "window-never-trimmed": ("tokens,window-reference", "never-trimmed", "300"),
    "restore-at-window": ("save-restore", None),  # no fault of ours is this bug: nothing may be named
}


def conform(tinygpt, bug, checks, tmp, tokens="40"):
    env = dict(os.environ, HELDOUT_BUG=bug)
    report = os.path.join(tmp, "report.json")
    args = [tinygpt, "conform", "--engine", ENGINE, "--tokens", tokens, "--threads", "1", "--checks", checks, "--json", report]
    if bug:
        args += ["--repro", os.path.join(tmp, "bundles"), "--repro-budget", "60", "--diagnose"]
    run = subprocess.run(args, env=env, capture_output=True, text=True)
    return run, (json.load(open(report)) if os.path.exists(report) else None)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    tinygpt, chosen = sys.argv[1], sys.argv[2:] or sorted(BUGS)
    with tempfile.TemporaryDirectory() as tmp:
        rows = sorted(set(",".join(BUGS[b][0] for b in chosen).split(",")))
        run, _ = conform(tinygpt, "", ",".join(rows), tmp)
        if run.returncode != 0:
            sys.exit("FAIL: the correct held-out engine does not pass %s:\n%s%s" % (rows, run.stdout[-3000:], run.stderr[-2000:]))
        print("the correct engine passes %s" % ",".join(rows))
    named, wrong = 0, []
    for bug in chosen:
        checks, twin = BUGS[bug][:2]
        with tempfile.TemporaryDirectory() as tmp:
            run, doc = conform(tinygpt, bug, checks, tmp, *BUGS[bug][2:])
            if run.returncode != 1 or doc is None:
                sys.exit("FAIL: conform exited %d on %s, not 1\n%s" % (run.returncode, bug, run.stderr[-2000:]))
            firsts = []
            for r in doc.get("repros", []):
                first = r["matches"][0] if r.get("matches") else None
                firsts.append(first)
                print("%s %s: %s -> %s requests; named %s" % (bug, r["row"], r["requests_before"], r["requests_after"], first or "nothing"))
            if twin in firsts or (twin is None and not any(firsts)):
                named += 1
            bad = [f for f in firsts if f and f != twin]
            if bad:
                wrong.append("%s named %s (its twin: %s)" % (bug, ", ".join(bad), twin))
    print("named the twin (or, with none, nothing) for %d of %d held-out bugs; wrong: %s" % (named, len(chosen), "; ".join(wrong) or "none"))
    if wrong:
        sys.exit("FAIL: a wrong fault was named")
    if named < 0.9 * len(chosen):
        sys.exit("FAIL: fewer than 90% named")
    print("PASS")


if __name__ == "__main__":
    main()
