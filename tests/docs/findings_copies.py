#!/usr/bin/env python3
"""Every bundle in docs/findings stays self-contained and current: the files a bundle copies from the
repository (repro.py, from checks/src/conform/repro.py, which `conform --repro` writes into every bundle)
must equal their source byte for byte, so a copy that fell behind its source fails here, not only when
someone replays it. repro.c and expected.h are a bundle's own (engines/llama.cpp/repro_c.py writes them
from its requests), requests.json and REPORT.md too.

Usage: findings_copies.py ROOT [--selftest]     exit 0 when every copy is its source, 1 naming each that is not
"""
import filecmp
import os
import shutil
import sys
import tempfile

COPIES = {"repro.py": os.path.join("checks", "src", "conform", "repro.py")}


def stale(root):
    out, bundles = [], 0
    findings = os.path.join(root, "docs", "findings")
    for name in sorted(os.listdir(findings)):
        d = os.path.join(findings, name)
        if not os.path.isdir(d):
            continue
        bundles += 1
        for copy, source in COPIES.items():
            path = os.path.join(d, copy)
            if os.path.exists(path) and not filecmp.cmp(path, os.path.join(root, source), shallow=False):
                out.append("docs/findings/%s/%s differs from %s (ci/findings.sh writes the bundles again)" % (name, copy, source))
            elif not os.path.exists(path):
                out.append("docs/findings/%s has no %s" % (name, copy))
    return out, bundles


def main(root, selftest):
    if selftest:  # a bundle whose repro.py fell one line behind its source must be caught
        with tempfile.TemporaryDirectory() as t:
            for rel in ("docs/findings", "checks/src/conform"):
                os.makedirs(os.path.join(t, rel))
            shutil.copy(os.path.join(root, COPIES["repro.py"]), os.path.join(t, COPIES["repro.py"]))
            os.makedirs(os.path.join(t, "docs", "findings", "a-finding"))
            with open(os.path.join(t, COPIES["repro.py"]), encoding="utf-8") as f:
                text = f.read()
            with open(os.path.join(t, "docs", "findings", "a-finding", "repro.py"), "w", encoding="utf-8") as f:
                f.write(text.replace("\n", "\n# an older line\n", 1))
            found, _ = stale(t)
            if len(found) != 1:
                print("selftest: a stale copy was not caught: %s" % found)
                return 1
            print("selftest: a stale copy is caught: " + found[0])
            return 0
    found, bundles = stale(root)
    for f in found:
        print("FAIL " + f)
    if not found:
        print("findings_copies: %d bundles, each copy equal to its source" % bundles)
    return 1 if found else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], "--selftest" in sys.argv[2:]))
