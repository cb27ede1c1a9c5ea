#!/usr/bin/env python3
"""The engine x model x row table from ci/engine-table.sh's reports (SETUP.MEMBER.json, .log and .time in
one folder): one line per row of the check table, one column per engine set-up, each cell what the
members did there - "pass (6)" when all passed, else the members that failed (with the first position
over the bound), were skipped or errored, and how many passed. A member the engine could not load is
"refused", its one-line reason under the table; then each set-up's wall time and the whole table's.
  engine_table.py DIR"""
import glob
import json
import os
import sys

ORDER = ["llama.cpp-0.4", "llama.cpp-0.7", "llama-server-0.7", "wllama", "onnxruntime", "transformers.js", "transformers.js-positions", "transformers-dynamic", "transformers-sliding", "transformers-static"]


def main():
    d = sys.argv[1]
    setups, members, rows, cells, notes, times = [], [], [], {}, [], {}
    for path in glob.glob(os.path.join(d, "*.time")):
        s, m = os.path.basename(path)[:-5].rsplit(".", 1)
        times[(s, m)] = int(open(path).read().split()[0])
    for log in sorted(glob.glob(os.path.join(d, "*.log"))):
        s, m = os.path.basename(log)[:-4].rsplit(".", 1)
        if s not in setups:
            setups.append(s)
        if m not in members:
            members.append(m)
        path = log[:-4] + ".json"
        if not os.path.exists(path):
            last = [l for l in open(log).read().splitlines() if l.strip()][-1:]
            notes.append("%s on %s: refused - %s" % (s, m, last[0] if last else "no report"))
            cells[(None, s, m)] = "refused"
            continue
        for c in json.load(open(path))["checks"]:
            if c["check"].startswith("sampler") or c["check"].startswith("declared"):
                continue
            if c["check"] not in rows:
                rows.append(c["check"])
            st = c["status"]
            cell = {"pass": "pass", "skipped": "skip", "error": "error"}.get(st, "FAIL")
            if st == "fail" and c.get("stats", {}).get("first_over") is not None:
                cell += " (%d)" % c["stats"]["first_over"]
            cells[(c["check"], s, m)] = cell
    setups.sort(key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER))

    def cell(r, s):
        got = {m: cells.get((r, s, m), cells.get((None, s, m))) for m in members}
        got = {m: v for m, v in got.items() if v}
        passed = [m for m, v in got.items() if v == "pass"]
        if got and len(passed) == len(got):
            return "pass (%d)" % len(passed)
        if got and all(v == "skip" for v in got.values()):
            return "skip"
        if got and all(v == "refused" for v in got.values()):
            return "refused"
        parts = []
        for kind in ("FAIL", "error", "refused", "skip"):
            these = ["%s%s" % (m, v[len(kind):]) for m, v in got.items() if v.startswith(kind)]
            if these:
                parts.append(("**%s** " % kind if kind in ("FAIL", "error") else kind + " ") + ", ".join(these))
        if passed:
            parts.append("%d pass" % len(passed))
        return "; ".join(parts) or "-"

    print("| row | " + " | ".join(setups) + " |")
    print("| --- |" + " --- |" * len(setups))
    for r in rows:
        print("| `%s` | " % r + " | ".join(cell(r, s) for s in setups) + " |")
    print("| wall time | " + " | ".join("%d s" % sum(t for (e, _), t in times.items() if e == s) for s in setups) + " |")
    if times:
        print("\nmembers: %s; whole table: %d cells, %d s one after another" % (", ".join(members), len(times), sum(times.values())))
    for n in notes:
        print("\n" + n)


if __name__ == "__main__":
    main()
