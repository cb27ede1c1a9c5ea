#!/usr/bin/env python3
"""A fault lives in one place: the fault table (checks/src/faults/, each fault's entry beside its class).
Every name of `tinygpt checks --json`'s faults is looked for, as a whole hyphenated word, in every text
file of SOURCE_DIR, and may appear only:

- in the table itself (checks/src/faults/) and in the tests (tests/: its test, the fault tables of the
  engine tests);
- in README.md and docs/ - generated there (docs/checks.md's tables), or named in prose, which
  tests/docs/check_docs.py holds to names the table has;
- in an engine adapter's folder (engines/ADAPTER/) where the name is that adapter's own planted fault
  (its faults.txt's TINYGPT_ENGINE_FAULT column: an engine's bug that happens to be called as ours is),
  and in its faults.txt, whose diagnosis column names our twin;
- in ci/'s scripts, where it is an adapter's planted fault the script drives (ci/repro-ratios.sh's lines).

Anywhere else - the library, the harness outside the table, the command line, the reports, the tools,
the kit - a fault's name is a second place that knows it, and fails this test.

Usage: fault_names.py TINYGPT SOURCE_DIR. Exit 0 when every name is where it may be, 1 otherwise.
"""
import json
import os
import re
import subprocess
import sys

SKIP_DIRS = {".git", "build", ".engines", "node_modules", "__pycache__", "Testing"}
TEXT = re.compile(r"\.(cpp|h|hpp|in|py|sh|mjs|js|cmake|txt|md|json|yml|yaml|c)$|^(CMakeLists\.txt|run)$")
WORD = re.compile(r"(?<![A-Za-z0-9_-])([a-z0-9]+(?:-[a-z0-9]+)+)(?![A-Za-z0-9_-])")


def adapter_faults(src):
    """{adapter: the faults planted in it} from engines/*/faults.txt's second column."""
    planted = {}
    engines = os.path.join(src, "engines")
    for adapter in sorted(os.listdir(engines)):
        path = os.path.join(engines, adapter, "faults.txt")
        if not os.path.isfile(path):
            continue
        names = set()
        for line in open(path, encoding="utf-8"):
            if line.startswith("#") or "|" not in line:
                continue
            names |= {n.strip() for n in line.split("|")[1].split(",")}
        planted[adapter] = names
    return planted


def allowed(rel, name, planted):
    parts = rel.split(os.sep)
    if rel.startswith(os.path.join("checks", "src", "faults") + os.sep) or parts[0] == "tests":
        return True
    if rel == "README.md" or parts[0] == "docs":
        return True
    if parts[0] == "engines" and len(parts) > 2:
        return parts[-1] == "faults.txt" or name in planted.get(parts[1], set())
    if parts[0] == "ci":
        return any(name in names for names in planted.values())
    return False


def main(tinygpt, src):
    table = json.loads(subprocess.run([tinygpt, "checks", "--json"], check=True, stdout=subprocess.PIPE, text=True).stdout)
    faults = {f["name"] for f in table["faults"]}
    planted = adapter_faults(src)
    problems, files = [], 0
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build-"))
        for n in sorted(names):
            if not TEXT.search(n):
                continue
            path = os.path.join(root, n)
            rel = os.path.relpath(path, src)
            try:
                text = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            files += 1
            for i, line in enumerate(text.splitlines(), 1):
                for word in WORD.findall(line):
                    if word in faults and not allowed(rel, word, planted):
                        problems.append("%s:%d names the fault %s outside the fault table" % (rel, i, word))
    for p in problems:
        print(p)
    print("fault_names: %d faults, %d files, %d names out of place" % (len(faults), files, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
