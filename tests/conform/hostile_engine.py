#!/usr/bin/env python3
"""An engine that misbehaves in one way, chosen by HOSTILE_MODE, for tests/conform/hostile.py: each
mode is one thing a real engine has done (or could) to the program that drives it. Modes that must
still pass forward every request to the example engine (engines/reference/python_reference.py) and
change only how the answers travel; the others answer hello and load themselves and misbehave at
the first request after that (or at the one the mode names).

HOSTILE_MARKER, when set, is put on the command line of a child this engine leaves running
(`sleep`-like), so the test can tell whether anything of the engine's outlived `tinygpt`.
HOSTILE_READY, when set, is a file written once the engine is loaded (a test sends its signal then).
"""
import json
import os
import subprocess
import sys
import time

MODE = os.environ.get("HOSTILE_MODE", "")
MARKER = os.environ.get("HOSTILE_MARKER", "hostile-child")
READY = os.environ.get("HOSTILE_READY", "")
HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "..", "engines", "reference", "python_reference.py")

# Modes whose answers are the example engine's, delivered oddly: conform must pass them.
PROXIED = {"stderr-flood", "odd-floats", "quit-blocked", "law-timeout", "generate-drops-one", "generate-unasked"}


def out(text):
    """Writes raw bytes or text to stdout, flushed."""
    data = text if isinstance(text, bytes) else text.encode()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def answer(obj):
    out(json.dumps(obj) + "\n")


def leave_a_child():
    """A child in the engine's process group, holding its stdout, running until killed."""
    return subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)", MARKER],
                            stdin=subprocess.DEVNULL)


def hang():
    leave_a_child()
    while True:
        time.sleep(1)


def odd_floats(line):
    """The same answer with every logit written in another valid JSON spelling of its float32 value."""
    a = json.loads(line)
    if "logits" not in a:
        return line
    rows = []
    for row in a["logits"]:
        spelled = []
        for k, x in enumerate(row):
            if float(x).is_integer() and abs(x) < 1e6:
                spelled.append("%d" % int(x) if k % 2 else "%.1f" % x)
            elif k % 3 == 0:
                spelled.append("%.9E" % x)  # 1.234567890E+00
            elif k % 3 == 1:
                spelled.append("%.12e" % x)
            else:
                spelled.append(repr(float(x)))
        rows.append("[" + ",".join(spelled) + "]")
    rest = {k: v for k, v in a.items() if k != "logits"}
    return json.dumps(rest)[:-1] + ', "logits": [' + ",".join(rows) + "]}"


def proxy():
    engine = subprocess.Popen([sys.executable, REFERENCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    samples = 0
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        if op == "quit" and MODE == "quit-blocked":
            engine.stdin.write(line.encode())
            engine.stdin.flush()
            engine.wait()
            out("x" * (1 << 20) + "\n")  # an unread answer bigger than the pipe: it blocks until read
            return
        if op == "sample" and MODE == "law-timeout":
            samples += 1
            if samples == 3:
                hang()
        engine.stdin.write(line.encode())
        engine.stdin.flush()
        if op == "quit":
            engine.wait()
            return
        got = engine.stdout.readline().decode()
        if op == "load" and MODE == "stderr-flood":
            block = ("engine log line " * 64 + "\n") * 1024  # about 1 MB
            for _ in range(20):
                sys.stderr.write(block)
            sys.stderr.flush()
        if MODE == "odd-floats":
            got = odd_floats(got.rstrip("\n")) + "\n"
        if op == "generate" and MODE in ("generate-drops-one", "generate-unasked"):
            a = json.loads(got)
            if MODE == "generate-drops-one":  # a request that silently never came back (generate_batch has done it)
                a["results"].pop()
            else:  # a result for a request nobody sent
                a["results"].append(dict(a["results"][0], id=999))
            got = json.dumps(a) + "\n"
        out(got)


def misbehave(req):
    """The misbehaviour at the first request after load."""
    if MODE == "hang":
        hang()
    if MODE == "die":
        sys.exit(3)
    if MODE == "not-json":
        out("hello, this is not JSON\n")
    elif MODE == "wrong-length":
        answer({"ok": True, "logits": [[0.5, 0.25, 0.125]]})
    elif MODE == "null-logit":
        answer({"ok": True, "logits": [[None] * 4096]})
    elif MODE == "bad-utf8":
        out(b'{"ok": false, "error": "raw bytes \xff\xfe\xc3 here"}\n')
    elif MODE == "cut-char":
        out(("a" * 199 + "\u00e9" * 50 + " not JSON\n").encode())
    elif MODE == "odd-text":
        # Valid JSON: a non-character, an escape sequence that clears a terminal, a bell, a NUL.
        answer({"ok": False, "error": "odd \ufffe\uffff text \u001b[2J\u001b[H cleared? \u0007 \u0000 end"})
    elif MODE == "huge-error":
        answer({"ok": False, "error": "E" * (20 << 20)})
    elif MODE == "huge-line":
        chunk = b"y" * (1 << 20)
        for _ in range(200):
            out(chunk)
        out(b"\n")
    elif MODE == "orphan-pipes":
        leave_a_child()
        sys.exit(0)
    elif MODE == "stop-reading":
        hang()
    else:
        answer({"ok": False, "error": "unknown HOSTILE_MODE %r" % MODE})


def stop_reading_at_a_long_request():
    """Refuses every request until one longer than the pipe's 64 KB arrives; stops reading that one
    part-way, so the writer finds the pipe full for good."""
    pending = b""
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            _, pending = pending.split(b"\n", 1)
            answer({"ok": False, "error": "refused"})
        if len(pending) > 8192:
            hang()


def main():
    if MODE in PROXIED:
        return proxy()
    loaded = False
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        if op == "quit":
            return
        if op == "hello":
            if MODE == "hello-name-7":
                answer({"ok": True, "name": 7, "formats": ["pt"]})
            elif MODE == "hello-protocol-99":
                answer({"ok": True, "name": "hostile", "protocol": 99, "formats": ["pt"]})
            else:
                answer({"ok": True, "name": "hostile (%s)" % MODE, "formats": ["pt"]})
            continue
        if op == "load":
            answer({"ok": True})
            loaded = True
            if READY:
                open(READY, "w").close()
            if MODE == "stop-reading":
                stop_reading_at_a_long_request()
            continue
        if not loaded:
            answer({"ok": False, "error": "no model loaded"})
            continue
        if MODE in ("sigterm", "sigint"):
            hang()
        misbehave(req)


if __name__ == "__main__":
    main()
