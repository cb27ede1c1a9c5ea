#!/usr/bin/env python3
"""`tinygpt conform` against an engine that misbehaves, one way per case (hostile_engine.py): each
case ends with the exit code it must (1 the engine is wrong, 2 it cannot be talked to, a signal's
own death for SIGTERM and SIGINT), in bounded time, with nothing of the engine left running, with
output that is valid UTF-8 and free of terminal escapes, and with every report file that exists
parsing (JSON and JUnit XML) and staying under a few MB whatever the engine printed.

usage: hostile.py TINYGPT WORK_DIR [CASE ...]   (no case: every case)
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET

TOOL, WORK = sys.argv[1], sys.argv[2]
ONLY = sys.argv[3:]
ENGINE = "%s %s" % ("/usr/bin/python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile_engine.py"))
TIMEOUT = "5"
SHORT = ["--checks", "tokens", "--tokens", "4"]
REPORT_LIMIT = 4 << 20

# name: (HOSTILE_MODE, expected exit (or -signal), conform arguments, text the output must hold, seconds at most)
CASES = {
    "hang": ("hang", 2, SHORT, "no answer to", 40),
    "die": ("die", 2, SHORT, "exited with status 3", 30),
    "not-json": ("not-json", 2, SHORT, "not JSON", 30),
    "wrong-length": ("wrong-length", 1, SHORT, "3 logits", 30),
    "null-logit": ("null-logit", 1, SHORT, "not a finite number", 30),
    "orphan-pipes": ("orphan-pipes", 2, SHORT, "no answer to", 40),
    "bad-utf8": ("bad-utf8", 2, SHORT, "not JSON", 30),
    "cut-char": ("cut-char", 2, SHORT, "not JSON", 30),
    "odd-text": ("odd-text", 1, SHORT, "odd ", 30),
    "huge-error": ("huge-error", 1, SHORT, "EEEE", 60),
    "huge-line": ("huge-line", 2, SHORT, "more than 64 MB", 60),
    "hello-name-7": ("hello-name-7", 2, SHORT, "\"name\" that is not a string", 30),
    "hello-protocol-99": ("hello-protocol-99", 2, SHORT, "protocol 99", 30),
    "stop-reading": ("stop-reading", 2, ["--checks", "sampler"], "stopped reading", 60),
    "sigterm": ("sigterm", -signal.SIGTERM, SHORT, "", 40),
    "sigint": ("sigint", -signal.SIGINT, SHORT, "", 40),
    # What must pass: an engine that floods stderr, spells its floats oddly, or writes an unread answer at quit.
    "stderr-flood": ("stderr-flood", 0, SHORT, "all 1 checks passed", 120),
    "odd-floats": ("odd-floats", 0, ["--checks", "tokens,logits", "--tokens", "8"], "all 2 checks passed", 120),
    "quit-blocked": ("quit-blocked", 0, SHORT, "all 1 checks passed", 120),
    # generate's answers: a sequence that never came back, a result for a request never sent.
    "generate-drops-one": ("generate-drops-one", 1, ["--checks", "served"], "answered no result for request", 120),
    "generate-unasked": ("generate-unasked", 1, ["--checks", "served"], "a result for no request it was sent", 120),
    # A timeout inside a sampler law is the engine's silence, not a falsified law.
    "law-timeout": ("law-timeout", 2, ["--checks", "sampler"], "no answer to 'sample'", 200),
}


def left_running(marker):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def run_case(name, mode, want, args, must_say, limit):
    problems = []
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    js, junit, ready = os.path.join(d, "r.json"), os.path.join(d, "r.xml"), os.path.join(d, "ready")
    for f in (js, junit, ready):
        if os.path.exists(f):
            os.remove(f)
    marker = "hostile-child-" + uuid.uuid4().hex
    env = dict(os.environ, HOSTILE_MODE=mode, HOSTILE_MARKER=marker, HOSTILE_READY=ready)
    cmd = [TOOL, "conform", "--engine", ENGINE, "--timeout", TIMEOUT, "--threads", "1", "--json", js, "--junit", junit, *args]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if want < 0:  # a signal to tinygpt once the engine is loaded and hanging
        while not os.path.exists(ready) and p.poll() is None and time.monotonic() - t0 < limit:
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(-want)
    try:
        stdout, stderr = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        problems.append("did not end within %d s" % limit)
    took = time.monotonic() - t0
    if p.returncode != want:
        problems.append("exit %s, expected %s" % (p.returncode, want))
    text = b""
    for stream, data in (("stdout", stdout), ("stderr", stderr)):
        if mode == "stderr-flood" and stream == "stderr":
            continue  # the engine's own stderr passes through: its 20 MB are not ours
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append("%s is not valid UTF-8: %s" % (stream, e))
        if b"\x1b" in data:
            problems.append("%s holds a terminal escape" % stream)
        if len(data) > REPORT_LIMIT:
            problems.append("%s is %d bytes" % (stream, len(data)))
        text += data
    if must_say and must_say.encode() not in text:
        problems.append("the output does not say %r" % must_say)
    if want == 1 and b"conform: FAIL" not in text:
        problems.append("no 'conform: FAIL <check>' line")
    for f, parse in ((js, json.load), (junit, ET.parse)):
        if not os.path.exists(f):
            continue
        if os.path.getsize(f) > REPORT_LIMIT:
            problems.append("%s is %d bytes" % (os.path.basename(f), os.path.getsize(f)))
        try:
            with open(f, "rb") as fh:
                parse(fh)
        except Exception as e:  # noqa: BLE001 - any parse error is the finding
            problems.append("%s does not parse: %s" % (os.path.basename(f), e))
    if want in (0, 1) and not os.path.exists(js):
        problems.append("no JSON report for a verdict")
    deadline = time.monotonic() + 3
    while left_running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = left_running(marker)
    if alive:
        problems.append("left running: %s" % alive)
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
    tail = text.decode("utf-8", "replace").strip().splitlines()[-3:]
    return problems, took, tail


def main():
    failed = 0
    for name, (mode, want, args, must_say, limit) in CASES.items():
        if ONLY and name not in ONLY:
            continue
        problems, took, tail = run_case(name, mode, want, args, must_say, limit)
        if problems:
            failed += 1
            print("FAIL %-18s %5.1fs  %s\n     last lines: %s" % (name, took, "; ".join(problems), tail))
        else:
            print("ok   %-18s %5.1fs  exit as expected" % (name, took))
        sys.stdout.flush()
    if failed:
        sys.exit("%d hostile case(s) went wrong" % failed)


if __name__ == "__main__":
    main()
