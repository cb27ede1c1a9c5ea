#!/usr/bin/env python3
"""The engine x model x row table from ci/engine-table.sh's reports: one column per engine set-up and zoo
member, one line per row; each cell pass, FAIL (first position), skip, error, or refused (the engine
could not load the member: its reason under the table).
  engine_table.py DIR"""
import glob
import json
import os
import sys


def main():
    d = sys.argv[1]
    cols, rows, cells, notes, times = [], [], {}, [], {}
    for path in glob.glob(os.path.join(d, "*.time")):  # ci/engine-table.sh writes SETUP.MEMBER.time
        e, m = os.path.basename(path)[:-5].rsplit(".", 1)
        times[(e, m)] = int(open(path).read().split()[0])
    for log in sorted(glob.glob(os.path.join(d, "*.log"))):
        engine, member = os.path.basename(log)[:-4].rsplit(".", 1)
        col = "%s %s" % (engine, member)
        cols.append(col)
        path = log[:-4] + ".json"
        if not os.path.exists(path):
            last = [l for l in open(log).read().splitlines() if l.strip()][-1:]
            notes.append("%s: refused - %s" % (col, last[0] if last else "no report"))
            continue
        doc = json.load(open(path))
        for c in doc["checks"]:
            if c["check"].startswith("sampler/") or c["check"].startswith("declared"):
                continue
            if c["check"] not in rows:
                rows.append(c["check"])
            st = c["status"]
            cell = {"pass": "pass", "skipped": "skip", "error": "error"}.get(st, "FAIL")
            if st == "fail" and c.get("stats", {}).get("first_over") is not None:
                cell += " (%d)" % c["stats"]["first_over"]
            cells[(c["check"], col)] = cell
    print("| row | " + " | ".join(cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    for r in rows:
        print("| `%s` | " % r + " | ".join(cells.get((r, c), "refused" if not any(k[1] == c for k in cells) else "-") for c in cols) + " |")
    print("| wall time | " + " | ".join("%s s" % times.get(tuple(c.split(" ")), "?") for c in cols) + " |")
    if times:
        print("\nwhole table: %d cells, %d s one after another" % (len(times), sum(times.values())))
    for n in notes:
        print("\n" + n)


if __name__ == "__main__":
    main()
