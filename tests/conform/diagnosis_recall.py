#!/usr/bin/env python3
"""The diagnosis's recall on held-out runs (docs/checks.md, "Diagnosis"): every planted serving fault of
our library (`tinygpt equivalence --cache FAULT`), of the example engine (python_reference.py,
TINYGPT_ENGINE_FAULT) and of the llama.cpp adapter (where it is built) is run again with `--vary N` for
N = 1, 2, 3 - another churn plan, other prompt lengths, another context-shift keep, so the positions and
magnitudes move - with `--diagnose`, and each run is counted as: its twin named first / "no known fault"
/ a wrong name. Passes when the twins are named in at least 90% of the runs of faults that have one, and
no run names a wrong fault (a fault without a twin must be "no known fault").

Usage: diagnosis_recall.py TINYGPT WORK_DIR [--engines example,llama.cpp,library] [--vary 1,2,3] [--spread]
                          [--library-untwinned] [--churn-alone] [--jobs N]
--spread runs each fault at one of the variations instead of all of them, the faults taking them in
turn (the test suite's run: every variation is held out, on a third of the faults each).
--library-untwinned runs a library fault only where no engine fault of the run has it for its twin (an
engine's run of the twin asks the diagnosis the same question, held out further: another engine's
arithmetic besides the variation).
--churn-alone leaves churn out of an engine fault's run where the fault has a row of its own (the rows
about it still move with --vary; churn's plan moves in the library's runs and in the runs of faults whose
row is churn) - churn through the Python engine is most of such a run's time.
Writes WORK_DIR/recall.json (every run: the fault, the twin, what was named, the diagnosis) and prints the
table. Exit 0 pass, 1 fail, 77 when nothing could run.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = "/usr/bin/python3 " + os.path.join(ROOT, "engines", "reference", "python_reference.py")
LLAMA = os.path.join(ROOT, ".engines", "llama.cpp", "adapter")
FIXTURE = os.path.join(ROOT, "golden", "fixture.safetensors")

# The held-out faults of each engine and the rows of their runs: the row the fault is about and churn,
# which drives every operation in a seeded plan (its positions are the ones --vary moves most). Each
# fault's twin - the fault of our table a diagnosis must name - is read from the table (`tinygpt checks
# --json`, each fault's "twins"); a fault no entry lists has no twin, and "no known fault" is the right
# answer for it. The library's own cases are the table's serving faults, each its own twin.
# The example engine's bugs, written as a Python engine has them (a shared list, a dict slot kept).
EXAMPLE_FAULTS = [
    ("fork-shares-storage", "fork,churn"),
    ("released-slot-not-reset", "join-leave,churn"),
    ("reused-prefix-too-long", "prefix-reuse,churn"),
    ("chunk-positions-restart", "chunked-prefill,churn"),
    ("position-by-request", "churn"),
    ("shift-keys-not-rotated", "context-shift,churn"),
    ("shift-off-by-one", "context-shift,churn"),
    ("rollback-keeps-one", "rollback,churn"),
    ("live-row-reused", "prefix-reuse"),
    ("shifted-entries-reused", "reuse-after-shift"),
    ("reused-past-the-window", "reuse-past-window"),
    ("state-saved-without-history", "rollback-after-restore"),
    ("restore-position-from-window", "save-restore"),
]
LLAMA_FAULTS = [
    ("rollback-forgets-the-window", "rollback"),
    ("reused-prefix-too-long", "prefix-reuse"),
    ("state-saved-in-part", "save-restore"),
    ("state-saved-without-history", "rollback-after-restore"),
    ("shift-not-renumbered", "context-shift"),
    ("extend-last-token-dropped", "chunked-prefill"),
]
# Each engine's adapter directory (engines/<adapter>/), as the table's twins name it.
ADAPTER = {"example": "reference", "llama.cpp": "llama.cpp"}


def table_cases(tinygpt):
    """(library cases, {(adapter, engine fault): our fault}) from the fault table."""
    table = json.loads(subprocess.run([tinygpt, "checks", "--json"], check=True, stdout=subprocess.PIPE, text=True).stdout)
    twin_of, library = {}, []
    for f in table["faults"]:
        for t in f.get("twins", []):
            adapter, _, name = t.partition(":")
            twin_of[(adapter, name)] = f["name"]
        if f.get("seam") == "serving":
            rows = ",".join(dict.fromkeys(f["expected"] + ["churn"]))
            library.append((f["name"], f["name"], rows))
    return library, twin_of


# The serving rows' runs: long enough for the rollback row's three drafts and fork's second fork (past the
# window) where a case runs those rows, or a save past the window; the other rows reach their operations
# in 40 tokens (churn's plan does not depend on it).
LONG_ROWS = {"rollback", "fork", "save-restore"}


def own_rows(rows):
    """`rows` without churn, where a row of the fault's own is left."""
    mine = [r for r in rows.split(",") if r != "churn"]
    return ",".join(mine) if mine else rows


def tokens_for(rows):
    return "320" if LONG_ROWS & set(rows.split(",")) else "40"


def run_one(tinygpt, work, case):
    engine, fault, twin, rows, vary = case
    tag = "%s.%s.%d" % (engine, fault, vary)
    out = os.path.join(work, tag + ".json")
    common = ["--tokens", tokens_for(rows), "--threads", "1", "--checks", rows, "--vary", str(vary), "--diagnose", "--json", out]
    env = dict(os.environ)
    if engine == "library":
        # On the fixture, as conform's runs are (equivalence's default is an untrained model).
        cmd = [tinygpt, "equivalence", "--cache", fault, "--checkpoint", FIXTURE] + common
    else:
        cmd = [tinygpt, "conform", "--engine", EXAMPLE if engine == "example" else LLAMA] + common
        env["TINYGPT_ENGINE_FAULT"] = fault
    began = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    result = {"engine": engine, "fault": fault, "twin": twin, "rows": rows, "vary": vary, "exit": p.returncode,
              "seconds": round(time.monotonic() - began, 1)}
    try:
        with open(out) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        result.update(outcome="error", named=None, text=p.stdout[-2000:])
        return result
    d = doc.get("diagnosis")
    if d is None:
        result.update(outcome="not caught", named=None, text="no row failed: " + p.stdout[-600:])
        return result
    named = d["matches"][0] if d.get("matches") else None
    if named is None:
        outcome = "no known fault"
    elif named == twin:
        outcome = "twin"
    else:
        outcome = "wrong"
    result.update(outcome=outcome, named=named, failing=d.get("failing"), text=d.get("text"))
    return result


def main():
    args = sys.argv[1:]
    tinygpt, work = args[0], args[1]
    engines, vary, jobs, spread, untwinned, churn_alone = ["library", "example", "llama.cpp"], [1, 2, 3], 2, False, False, False
    i = 2
    while i < len(args):
        if args[i] in ("--spread", "--library-untwinned", "--churn-alone"):
            spread = spread or args[i] == "--spread"
            untwinned = untwinned or args[i] == "--library-untwinned"
            churn_alone = churn_alone or args[i] == "--churn-alone"
            i += 1
            continue
        if args[i] == "--engines":
            engines = args[i + 1].split(",")
        elif args[i] == "--vary":
            vary = [int(v) for v in args[i + 1].split(",")]
        elif args[i] == "--jobs":
            jobs = int(args[i + 1])
        else:
            sys.exit("diagnosis_recall.py: unknown argument %r" % args[i])
        i += 2
    os.makedirs(work, exist_ok=True)
    library, twin_of = table_cases(tinygpt)
    cases, skipped = [], []
    tables = {}
    for engine in engines:
        if engine == "llama.cpp" and not os.access(LLAMA, os.X_OK):
            skipped.append("llama.cpp: the adapter is not built (ci/engines.sh builds it)")
            continue
        if engine != "library":
            faults = {"example": EXAMPLE_FAULTS, "llama.cpp": LLAMA_FAULTS}[engine]
            tables[engine] = [(f, twin_of.get((ADAPTER[engine], f)), own_rows(rows) if churn_alone else rows) for f, rows in faults]
    if "library" in engines:
        twinned = {twin for table in tables.values() for _, twin, _ in table if twin}
        tables["library"] = [c for c in library if not (untwinned and c[0] in twinned)]
        if untwinned:
            skipped.append("library: %d faults whose engine twins run here" % (len(library) - len(tables["library"])))
    for engine in engines:
        table = tables.get(engine, [])
        for fault, twin, rows in table:
            for v in ([vary[len(cases) % len(vary)]] if spread else vary):
                cases.append((engine, fault, twin, rows, v))
    if not cases:
        print("diagnosis_recall: nothing to run: " + "; ".join(skipped))
        return 77
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda c: run_one(tinygpt, work, c), cases))
    with open(os.path.join(work, "recall.json"), "w") as f:
        json.dump(results, f, indent=1)
    twins = [r for r in results if r["twin"]]
    named = sum(r["outcome"] == "twin" for r in twins)
    wrong = [r for r in results if r["outcome"] == "wrong"]
    bad = [r for r in results if r["outcome"] in ("error", "not caught")]
    print("%-10s %-30s %-30s %s" % ("engine", "fault", "twin", "per --vary: what the diagnosis named"))
    by_fault = {}
    for r in results:
        by_fault.setdefault((r["engine"], r["fault"], r["twin"]), []).append(r)
    for (engine, fault, twin), rs in by_fault.items():
        cells = ", ".join("%d: %s" % (r["vary"], r["named"] if r["outcome"] in ("twin", "wrong") else r["outcome"]) for r in rs)
        print("%-10s %-30s %-30s %s" % (engine, fault, twin or "(none)", cells))
    for s in skipped:
        print("skipped: " + s)
    share = named / len(twins) if twins else 1.0
    print("twins named in %d of %d held-out runs (%.0f%%); no known fault in %d; a wrong name in %d; %d runs that caught nothing or erred"
          % (named, len(twins), 100 * share, sum(r["outcome"] == "no known fault" for r in twins), len(wrong), len(bad)))
    for r in wrong + bad:
        print("  %s %s --vary %d: %s: %s" % (r["engine"], r["fault"], r["vary"], r["outcome"], (r.get("text") or "")[:1500]))
    return 0 if share >= 0.9 and not wrong and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
