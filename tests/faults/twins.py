#!/usr/bin/env python3
"""The fault table's engine twins agree with the engine adapters' fault tables.

Usage: twins.py TINYGPT ROOT

Reads the fault table (`tinygpt checks --json`: each fault's "twins", "adapter:name") and every
engines/<adapter>/faults.txt. Fails when:
  - a twin names an adapter directory that does not exist, or a fault that adapter does not plant
    (the name is in no line of its faults.txt and in none of its source files);
  - a faults.txt line expects `--diagnosis X` for its planted fault F while X is not in the table or
    does not list "adapter:F" among its twins (the line and the table would state two relations);
  - one adapter's fault is the twin of two of our faults (a diagnosis could name only one).
"""
import json
import os
import re
import subprocess
import sys


def planted(root, adapter):
    """The fault names an adapter's faults.txt plants (its second column), and its sources' text."""
    d = os.path.join(root, "engines", adapter)
    names, text = set(), []
    table = os.path.join(d, "faults.txt")
    lines = []
    if os.path.exists(table):
        with open(table) as f:
            for n, line in enumerate(f, 1):
                if line.strip() and not line.startswith("#"):
                    cols = [c.strip() for c in line.split("|")]
                    if len(cols) >= 6:
                        names.update(x for x in cols[1].split(",") if x)
                        lines.append((n, cols))
    for dirpath, _, files in os.walk(d):
        for name in files:
            if name.endswith((".py", ".cpp", ".mjs", ".js", ".h", ".txt")):
                with open(os.path.join(dirpath, name), errors="replace") as f:
                    text.append(f.read())
    return names, "\n".join(text), lines


def main():
    tinygpt, root = sys.argv[1], sys.argv[2]
    table = json.loads(subprocess.run([tinygpt, "checks", "--json"], check=True, stdout=subprocess.PIPE, text=True).stdout)
    faults = {f["name"]: f for f in table["faults"]}
    problems, seen = [], {}
    adapters = {}
    for f in table["faults"]:
        for twin in f.get("twins", []):
            adapter, _, name = twin.partition(":")
            if not os.path.isdir(os.path.join(root, "engines", adapter)):
                problems.append("%s: twin %s names no adapter (engines/%s)" % (f["name"], twin, adapter))
                continue
            if adapter not in adapters:
                adapters[adapter] = planted(root, adapter)
            names, text, _ = adapters[adapter]
            if name not in names and not re.search(r"\b%s\b" % re.escape(name), text):
                problems.append("%s: twin %s is planted nowhere in engines/%s" % (f["name"], twin, adapter))
            if twin in seen:
                problems.append("%s is the twin of both %s and %s" % (twin, seen[twin], f["name"]))
            seen[twin] = f["name"]
    count = 0
    for adapter in sorted(os.listdir(os.path.join(root, "engines"))):
        if not os.path.exists(os.path.join(root, "engines", adapter, "faults.txt")):
            continue
        _, _, lines = adapters.get(adapter) or planted(root, adapter)
        for n, cols in lines:
            m = re.search(r"--diagnosis (\S+)", cols[4])
            if not m or m.group(1) == "none":
                continue
            count += 1
            ours, theirs = m.group(1), cols[1]
            where = "engines/%s/faults.txt:%d" % (adapter, n)
            if ours not in faults:
                problems.append("%s: --diagnosis %s is no fault of the table" % (where, ours))
            elif "%s:%s" % (adapter, theirs) not in faults[ours].get("twins", []):
                problems.append("%s: %s is diagnosed as %s, whose twins (%s) do not list %s:%s"
                                % (where, theirs, ours, ", ".join(faults[ours].get("twins", [])) or "none", adapter, theirs))
    for p in problems:
        print(p)
    print("twins: %d in the table, %d faults.txt lines naming one; %d problems" % (len(seen), count, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
