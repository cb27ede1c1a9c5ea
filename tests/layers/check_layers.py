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
    for p in problems:
        print("FAIL " + p)
    if not problems:
        print("layers ok: %d files include only the layers above them" % files)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
