#!/usr/bin/env python3
"""docs/ci/github-actions.yml works as copied: every script it runs exists, every flag it passes a script
or a `tinygpt` command is one that script or command takes, and a job that fetches the engines
(ci/engines.sh) has installed what that needs (`ci/install.sh --engines`, or npm and git by apt) - the
workflow is read as text (each step's `run:`, folded or literal), no YAML library needed.

Usage: workflow_check.py TINYGPT ROOT [--selftest]     exit 0 when it holds, 1 naming each problem
"""
import os
import re
import subprocess
import sys

WORKFLOW = os.path.join("docs", "ci", "github-actions.yml")


def jobs_of(text):
    """{job: [run command, ...]}: each step's `run:` value, a folded block joined by spaces."""
    jobs, job, lines = {}, None, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^  ([\w-]+):\s*$", line)
        if m:
            job = m.group(1)
            jobs[job] = []
        m = re.match(r"^(\s*)(?:- )?run:\s*(.*)$", line)
        if m and job:
            indent, value = len(m.group(1)), m.group(2).strip()
            if value in ("|", ">"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                jobs[job] += [" ".join(x for x in block if x)] if value == ">" else [x for x in block if x and not x.startswith("#")]
                continue
            jobs[job].append(value)
        i += 1
    return jobs


def commands(run):
    """The commands of one run line: split at &&, ;, | (a pipe), each with its words."""
    for part in re.split(r"&&|;|\|(?!\|)", run):
        words = part.replace('"', " ").split()
        if words:
            yield words


def check(tinygpt, root, text):
    problems, helps = [], {}

    def help_of(cmd):
        if cmd not in helps:
            helps[cmd] = subprocess.run([tinygpt, cmd, "--help"], capture_output=True, text=True).stdout
        return helps[cmd]

    for job, runs in jobs_of(text).items():
        can_fetch = False
        for run in runs:
            for words in commands(run):
                if words[0] in ("bash", "sh", "python3") and len(words) > 1:
                    script = re.sub(r"^tinygpt-verify/", "", words[1])
                    if not os.path.exists(os.path.join(root, script)):
                        problems.append("%s: runs %s, which the repository does not have" % (job, words[1]))
                        continue
                    body = open(os.path.join(root, script), encoding="utf-8").read()
                    for flag in (w for w in words[2:] if w.startswith("--")):
                        if flag not in body:
                            problems.append("%s: passes %s to %s, which takes no such flag" % (job, flag, script))
                    if script == "ci/engines.sh":
                        if not can_fetch:
                            problems.append("%s: runs ci/engines.sh before installing npm and git "
                                            "(ci/install.sh --engines, or apt-get install npm git)" % job)
                    if script == "ci/install.sh" and "--engines" in words:
                        can_fetch = True
                elif words[0] == "apt-get" and "install" in words and "npm" in words and "git" in words:
                    can_fetch = True
                elif words[0] == "tinygpt" and len(words) > 1:
                    h = help_of(words[1])
                    if not h:
                        problems.append("%s: `tinygpt %s` is no command" % (job, words[1]))
                        continue
                    for flag in (w for w in words[2:] if w.startswith("--")):
                        if not re.search(r"(^|[\s,])%s\b" % re.escape(flag), h):
                            problems.append("%s: `tinygpt %s` takes no %s" % (job, words[1], flag))
    return problems


def main(tinygpt, root, selftest):
    text = open(os.path.join(root, WORKFLOW), encoding="utf-8").read()
    if selftest:  # the workflow as it was: the engines fetched after an install without --engines
        broken = text.replace("bash ci/install.sh --engines &&", "bash ci/install.sh &&").replace("--no-table", "--no-such-flag")
        found = check(tinygpt, root, broken)
        want = ["ci/engines.sh before installing", "--no-such-flag"]
        missing = [w for w in want if not any(w in p for p in found)]
        if broken == text or missing:
            print("selftest: not caught: %s (found %s)" % (missing or "the planted edits did not apply", found))
            return 1
        print("selftest: caught: " + "; ".join(found))
        return 0
    found = check(tinygpt, root, text)
    for p in found:
        print("FAIL " + p)
    if not found:
        print("workflow_check: %s runs only scripts and flags that exist, the engines after what they need" % WORKFLOW)
    return 1 if found else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2], "--selftest" in sys.argv[3:]))
