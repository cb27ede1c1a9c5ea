#!/usr/bin/env python3
"""Counts the docs state about the fault table, against the table itself (`tinygpt checks --json`).

Usage: table_counts.py TINYGPT ROOT

Each rule is a sentence shape the docs use for a count of the table's faults, and the count it must
be. A number in digits or words ("thirteen") counts; a shape with no number ("its boundary faults")
is not a claim. A fault added to the table without the docs following fails here. (README's verify
excerpt is held by readme_counts.py against verify's own report.)
"""
import glob
import json
import os
import re
import subprocess
import sys

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]


def number(token):
    t = token.lower()
    if t.isdigit():
        return int(t)
    return WORDS.index(t) if t in WORDS else None


def main():
    tinygpt, root = sys.argv[1], sys.argv[2]
    table = json.loads(subprocess.run([tinygpt, "checks", "--json"], check=True, stdout=subprocess.PIPE, text=True).stdout)
    faults = table["faults"]
    zoo = sum("feature" in f for f in faults)
    spec_rows = {"spec-greedy", "spec-cache", "spec-stops"}
    spec_caught = sum(f["seam"] == "speculative" and "feature" not in f and bool(spec_rows & set(f["expected"])) for f in faults)
    rules = [
        (r"\b(\w+) boundary faults\b", zoo, "the zoo's boundary faults (faults with a feature)"),
        (r"runs all (\w+) on all six members", zoo, "the zoo's boundary faults (faults with a feature)"),
        (r"Each of the (\w+) faults those four rows catch", spec_caught,
         "speculative faults of the seed's architecture caught by spec-greedy, spec-cache or spec-stops"),
    ]
    files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    problems, claims = [], 0
    for path in files:
        text = open(path, encoding="utf-8").read()
        for pattern, want, what in rules:
            for m in re.finditer(pattern, text):
                got = number(m.group(1))
                if got is None:
                    continue
                claims += 1
                if got != want:
                    line = text.count("\n", 0, m.start()) + 1
                    problems.append("%s:%d: \"%s\" says %d; the table has %d (%s)"
                                    % (os.path.relpath(path, root), line, m.group(0), got, want, what))
    for p in problems:
        print(p)
    print("table counts: %d claims read in %d files; %d disagree" % (claims, len(files), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
