#!/usr/bin/env python3
"""A row's description never says a number its code does not use: the prose of every row of the check
table (its CheckDef, in its own file of checks/src/table/) is built from the row's constants, so no
string literal there may hold a number of its own ("top-2" and the like, a word, are no numbers).

  row_prose.py SOURCE_DIR
"""
import glob
import os
import re
import sys


def defs(text):
    """The bodies of `CheckDef NAME_def() { ... }` in a source file."""
    for m in re.finditer(r"CheckDef (\w+_def)\(\) \{", text):
        depth, i = 0, m.end() - 1
        while True:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        yield m.group(1), text[m.end():i]


def main():
    root = sys.argv[1]
    problems, seen = [], 0
    for path in sorted(glob.glob(os.path.join(root, "checks", "src", "table", "*.cpp"))):
        text = open(path).read()
        for name, body in defs(text):
            seen += 1
            for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', body):
                for num in re.findall(r"(?<![\w-])\d+(?:\.\d+)?", lit):
                    problems.append("%s: %s: the number %s is written into its prose: %r" % (os.path.basename(path), name, num, lit))
    if seen < 20:
        problems.append("found %d row definitions (CheckDef NAME_def()) in checks/src/table/: expected every row of the table" % seen)
    for p in problems:
        print("FAIL: " + p)
    print("%d rows' prose read; %d numbers written by hand" % (seen, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
