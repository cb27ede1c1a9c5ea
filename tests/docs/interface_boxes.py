#!/usr/bin/env python3
"""docs/ARCHITECTURE.md's interface boxes name every virtual of the interfaces they draw.

Usage: interface_boxes.py ROOT

For each interface (DecodeTarget, RowServing, KVCache), every virtual member function its header
declares must appear in ARCHITECTURE.md as `name(`: a method added to the interface without the
architecture following fails here.
"""
import os
import re
import sys

INTERFACES = [
    ("checks/include/tinygpt/checks/target.h", "DecodeTarget"),
    ("checks/include/tinygpt/checks/target.h", "RowServing"),
    ("lib/include/tinygpt/kv_cache.h", "KVCache"),
]


def virtuals(path, cls):
    text = open(path, encoding="utf-8").read()
    m = re.search(r"\nclass %s\b[^{;]*\{" % cls, text)
    if not m:
        raise SystemExit("%s: no class %s" % (path, cls))
    depth, j = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    names = set(re.findall(r"virtual [^;{(]*?~?\b(\w+)\(", text[m.end():j]))
    return sorted(names - {cls})


def main(root):
    arch = open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8").read()
    problems, count = [], 0
    for path, cls in INTERFACES:
        for name in virtuals(os.path.join(root, path), cls):
            count += 1
            if not re.search(r"\b%s\(" % re.escape(name), arch):
                problems.append("docs/ARCHITECTURE.md does not name %s::%s() (%s)" % (cls, name, path))
    for p in problems:
        print(p)
    print("interface boxes: %d virtuals of %d interfaces; %d not named" % (count, len(INTERFACES), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
