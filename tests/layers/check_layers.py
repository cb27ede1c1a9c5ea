#!/usr/bin/env python3
"""The include graph follows the layers (docs/ARCHITECTURE.md): each folder includes only the
installed headers of the layers above it and its own, never another layer's sources.
Usage: check_layers.py SOURCE_DIR
"""
import os
import re
import sys

# folder -> the include prefixes it may use ("" is the model's own top-level tinygpt/*.h)
LAYERS = [
    ("lib", ["model"]),
    ("results", ["model", "results"]),
    ("properties", ["model", "results", "laws"]),
    ("checks", ["model", "results", "laws", "checks"]),
    ("conformance", ["model", "results", "laws", "checks", "conformance"]),
    ("tools", ["model", "results", "laws", "checks", "tools"]),
    ("cli", ["model", "results", "laws", "checks", "tools"]),
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# The harness's rooms, bottom first (docs/ARCHITECTURE.md, "The harness's rooms"): each public header of
# tinygpt/checks/ belongs to one, each folder of checks/src/ is one, and a room includes only the headers
# of its own room and the rooms below it - no arrow up inside checks/.
ROOMS = ["base", "targets", "table", "faults", "runs", "conform", "reports"]
HEADER_ROOM = {
    "base": ["results", "data", "ops", "parallel_runs", "check_names", "reference", "judge", "export"],
    "targets": ["cache_variant", "target", "churn", "kv_cost"],
    "table": ["check_suite", "deviations"],
    "faults": ["cache_registry", "faults"],
    "runs": ["inject", "golden_compare", "golden", "sample_grid", "verify", "diagnose"],
    "conform": ["conform", "engine_unusable", "repro"],
    "reports": ["report", "catalogue", "compare"],
}
ROOM_OF = {h: r for r, hs in HEADER_ROOM.items() for h in hs}


def rooms(src):
    """Arrows up between the harness's rooms: (file, line, header, why) for each."""
    problems, base = [], os.path.join(src, "checks")
    headers = os.path.join(base, "include", "tinygpt", "checks")
    for n in sorted(os.listdir(headers)):
        if n.endswith(".h") and n[:-2] not in ROOM_OF:
            problems.append("checks/include/tinygpt/checks/%s is in no room (check_layers.py's HEADER_ROOM)" % n)
    files = [(os.path.join(headers, n), ROOM_OF.get(n[:-2])) for n in sorted(os.listdir(headers)) if n.endswith(".h")]
    srcdir = os.path.join(base, "src")
    for entry in sorted(os.listdir(srcdir)):
        full = os.path.join(srcdir, entry)
        if os.path.isdir(full):
            if entry not in ROOMS:
                problems.append("checks/src/%s/ is no room (check_layers.py's ROOMS)" % entry)
                continue
            files += [(os.path.join(full, n), entry) for n in sorted(os.listdir(full)) if n.endswith((".h", ".cpp"))]
        elif entry.endswith(".cpp"):
            problems.append("checks/src/%s is in no room: a source lives in its room's folder" % entry)
    for path, room in files:
        if room is None:
            continue
        for i, line in enumerate(open(path, encoding="utf-8"), 1):
            m = INCLUDE.match(line)
            if not m or not m.group(1).startswith("tinygpt/checks/"):
                continue
            target = ROOM_OF.get(m.group(1)[len("tinygpt/checks/"):-2])
            if target and ROOMS.index(target) > ROOMS.index(room):
                problems.append("%s:%d includes \"%s\": the %s room is above %s" % (os.path.relpath(path, src), i, m.group(1), target, room))
    return problems


def kind(header):
    """The layer a quoted include belongs to, or None for a file of the including folder itself."""
    if not header.startswith("tinygpt/"):
        return None
    rest = header[len("tinygpt/"):]
    return rest.split("/")[0] if "/" in rest else "model"


def main(src):
    problems, files = [], 0
    for folder, allowed in LAYERS:
        for root, _, names in os.walk(os.path.join(src, folder)):
            r = root.replace(os.sep, "/")
            if "/examples" in r or r.endswith("/test"):
                continue  # outside projects (built against the installed package) and test suites
            for n in names:
                if not n.endswith((".h", ".cpp", ".in")):
                    continue
                path = os.path.join(root, n)
                files += 1
                for i, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    k = kind(m.group(1))
                    rel = os.path.relpath(path, src)
                    if k is None:
                        # a private header: it must live in this folder
                        here = os.path.join(root, m.group(1))
                        if not os.path.exists(here) and not m.group(1).endswith(".h.in") and m.group(1) != "paths.h":
                            problems.append("%s:%d includes \"%s\": not a file of %s/ nor an installed header"
                                            % (rel, i, m.group(1), folder))
                    elif k not in allowed:
                        problems.append("%s:%d includes \"%s\": %s/ is below the %s layer" % (rel, i, m.group(1), folder, k))
    problems += rooms(src)
    for p in problems:
        print("FAIL " + p)
    if not problems:
        print("layers ok: %d files include only the layers above them" % files)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
