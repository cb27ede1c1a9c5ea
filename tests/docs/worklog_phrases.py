#!/usr/bin/env python3
"""The repository speaks of the product: no doc or comment reads as a work log ("before this issue",
"the engines issue", "after both commits", "an earlier run's finding"). Scans README.md, docs/ (but the
bundles of docs/findings, which carry the commit that found them by design) and every source and script
file; prints each phrase with its file and line.

Usage: worklog_phrases.py ROOT          exit 0 when none, 1 naming each
       worklog_phrases.py --selftest    the patterns catch a planted phrase of each kind and pass prose
"""
import os
import re
import sys

PATTERNS = [
    r"\bthis issue\b", r"\bthe issue's\b", r"\bthe [\w.-]+ issue\b(?! (?:tracker|about))", r"\bissue #?\d+\b",
    r"\b(?:this|an earlier|a previous|the previous|the last) session\b", r"\bsessions? (?:ago|before)\b",
    r"\b(?:this|that|one|both|the previous) commits?\b(?! \w+ing)", r"\bcommits? earlier\b",
    r"\bbefore this change\b", r"\ban earlier run's finding\b", r"\b(?:asked for|filed) before, not built\b",
]
SOURCES = (".md", ".cpp", ".h", ".hpp", ".py", ".sh", ".cmake", ".txt", ".mjs", ".js", ".in", ".yml")
SKIP_DIRS = {".git", "build", ".engines", "node_modules", "findings", "corpus"}


def scan(root):
    found = []
    rx = re.compile("|".join(PATTERNS), re.I)
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        for name in files:
            if not name.endswith(SOURCES) and name != "CMakeLists.txt":
                continue
            path = os.path.join(dirpath, name)
            if os.path.abspath(path) == os.path.abspath(__file__):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = rx.search(line)
                    if m:
                        found.append("%s:%d: %r in %s" % (os.path.relpath(path, root), n, m.group(0), line.strip()[:160]))
    return found


def selftest():
    rx = re.compile("|".join(PATTERNS), re.I)
    bad = ["ran 78 s before this issue", "(the issue's figure)", "the cache-reuse issue cost", "as issue 85 asks",
           "in an earlier session", "after both commits", "one commit earlier", "An earlier run's finding"]
    good = ["no issue about the shift was found in the tracker", "the commit and date", "a new session is a new group",
            "llama.cpp #9477's shape", "the issue tracker"]
    missed = [t for t in bad if not rx.search(t)]
    wrong = [t for t in good if rx.search(t)]
    for t in missed:
        print("selftest: not caught: %r" % t)
    for t in wrong:
        print("selftest: prose flagged: %r" % t)
    if missed or wrong:
        return 1
    print("selftest: %d work-log phrases caught, %d lines of prose passed" % (len(bad), len(good)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        sys.exit(selftest())
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    found = scan(sys.argv[1])
    for f in found:
        print("FAIL " + f)
    if not found:
        print("worklog_phrases: no doc or comment reads as a work log")
    sys.exit(1 if found else 0)
