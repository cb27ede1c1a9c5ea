#!/usr/bin/env python3
"""README's verify excerpt against verify's own report. The "Reading a report" block quotes the main
job's summary: the rows verify prints ("verify: all N checks passed"), the fault matrix's score
("C/T faults caught") and the checks each production cache runs ("...; N checks"). Each count must
be the one `tinygpt verify --json` wrote on the shipped fixture, so a row or a fault added without
the README following fails here.

The README's screenshot of the report (docs/report.png, which docs/reports.md shows) carries the counts
it shows in docs/report.json, written with it by ci/update-docs.sh: they must be the report's too.

Usage: readme_counts.py VERIFY_JSON README [SCREENSHOT_COUNTS_JSON]
       readme_counts.py --screenshot-counts VERIFY_JSON   (prints the counts ci/update-docs.sh stores)
"""
import json
import re
import sys


def counts(report):
    """The figures a screenshot of the report shows: its rows and the fault matrix's score."""
    return {"checks": len(report["checks"]), "faults_caught": report["fault_matrix"]["caught"],
            "faults": report["fault_matrix"]["total"]}


def main(report_path, readme_path, screenshot_path=None):
    report = json.load(open(report_path, encoding="utf-8"))
    readme = open(readme_path, encoding="utf-8").read()
    problems = []

    def expect(what, pattern, actual):
        found = re.findall(pattern, readme)
        if not found:
            problems.append("README quotes no %s (pattern %r)" % (what, pattern))
        for got in found:
            got = tuple(int(x) for x in (got if isinstance(got, tuple) else (got,)))
            if got != actual:
                problems.append("README says %s %s; verify's report says %s" % (what, "/".join(map(str, got)),
                                                                                 "/".join(map(str, actual))))

    rows = report["checks"]
    expect("the rows verify prints", r"verify: all (\d+) checks passed", (len(rows),))
    matrix = report["fault_matrix"]
    expect("the fault matrix's score", r"(\d+)/(\d+) faults caught", (matrix["caught"], matrix["total"]))
    for row in rows:
        m = re.match(r"cache-equivalence \[(\w+)\]$", row["check"])
        if not m:
            continue
        n = re.search(r"; (\d+) checks$", row["figure"])
        if n:
            expect("the checks of the %s cache" % m.group(1),
                   r"cache-equivalence \[%s\] +PASS +[0-9.]+s +[^\n]*; (\d+) checks\n" % m.group(1), (int(n.group(1)),))
            break  # the README quotes the first production cache
    if screenshot_path:
        shown = json.load(open(screenshot_path, encoding="utf-8"))
        if shown != counts(report):
            problems.append("docs/report.png shows %s; verify's report has %s: run ctest, then bash ci/update-docs.sh"
                            % (shown, counts(report)))
    if problems:
        print("\n".join(problems))
        return 1
    print("README's verify excerpt: %d rows, %d/%d faults, counts as verify's report has them" %
          (len(rows), matrix["caught"], matrix["total"]))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--screenshot-counts":
        print(json.dumps(counts(json.load(open(sys.argv[2], encoding="utf-8"))), sort_keys=True))
        sys.exit(0)
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
