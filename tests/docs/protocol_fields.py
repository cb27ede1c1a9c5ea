#!/usr/bin/env python3
"""Every field conform sends has a row in docs/protocol.md's field tables.

  protocol_fields.py proxy LOG -- ENGINE COMMAND...
      An engine that is ENGINE COMMAND with every request it is sent recorded: each line from conform goes to
      the engine unchanged and each answer back; the request's fields (op.field, op.list[].field for a list of
      objects, op.object.field for an object) are appended to LOG, one per line, as they are first seen.
  protocol_fields.py check LOG DOC [--require OP.FIELD,...]
      Exit 0 when every field in LOG, and every one --require names (those only flags send, checked where no
      run of the suite's sends them), is a row of DOC's field tables: the table rows under "## Every field
      conform sends" whose first cell is `op` and second `field`. Exit 1 naming each field missing; 2 on a
      LOG that holds nothing (the run it records did not happen).
  protocol_fields.py selftest DOC
      The check fails on a field the tables lack and passes on one they have.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading


def light(line):
    """The request line with its large arrays of arrays (logits, history: numbers only) emptied, so a
    320 KB `sample` request parses in microseconds: their names are the fields, their numbers are not."""
    for key in (b'"logits":', b'"history":'):
        i = line.find(key)
        if i < 0:
            continue
        j = line.find(b"[", i)
        k = line.find(b"]]", j)
        if j < 0 or k < 0:
            continue
        line = line[:j] + b"[]" + line[k + 2:]
    return line


def fields_of(request):
    """The request's op as "op." and its fields as op.field, op.list[].field and op.object.field."""
    op = request.get("op", "?")
    out = {"%s." % op}
    for key, value in request.items():
        if key == "op":
            continue
        out.add("%s.%s" % (op, key))
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for v in value:
                out.update("%s.%s[].%s" % (op, key, k) for k in v)
        elif isinstance(value, dict):
            out.update("%s.%s.%s" % (op, key, k) for k in value)
    return out


def read_log(log):
    """The fields a log holds (none where there is no log)."""
    if not os.path.exists(log):
        return set()
    with open(log) as f:
        return set(line.strip() for line in f if line.strip())


def proxy(log, command):
    engine = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1 << 16)
    seen = read_log(log)

    def answers():  # the engine's answers, back to conform as they come
        out = sys.stdout.buffer
        for line in iter(engine.stdout.readline, b""):
            out.write(line)
            out.flush()

    t = threading.Thread(target=answers, daemon=True)
    t.start()
    with open(log, "a") as record:
        for line in iter(sys.stdin.buffer.readline, b""):
            try:
                try:
                    request = json.loads(light(line))
                except ValueError:  # an array the shortcut cut wrongly: the whole line
                    request = json.loads(line)
                new = fields_of(request) - seen if isinstance(request, dict) else set()
            except ValueError:
                new = set()
            for f in sorted(new):
                record.write(f + "\n")
            record.flush()
            seen |= new
            try:
                engine.stdin.write(line)
                engine.stdin.flush()
            except BrokenPipeError:
                break
    try:
        engine.stdin.close()
    except BrokenPipeError:
        pass
    code = engine.wait()
    t.join(timeout=5)
    return code


def documented(doc):
    """The (op, field) pairs of the field tables: rows `| \\`op\\` | \\`field\\` | ...` under the section."""
    text = open(doc, encoding="utf-8").read()
    m = re.search(r"^## Every field conform sends$(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        return None
    rows = set()
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[2]:
            rows.add("%s." % cells[0].strip("`"))  # the op itself
            if cells[1].startswith("`"):
                rows.add("%s.%s" % (cells[0].strip("`"), cells[1].strip("`")))
    return rows


def check(log, doc, required):
    rows = documented(doc)
    if rows is None:
        print("protocol_fields: %s has no section '## Every field conform sends'" % doc)
        return 1
    sent = read_log(log)
    if not sent:
        print("protocol_fields: %s records no request (the conform run that writes it did not run)" % log)
        return 2
    missing = sorted(f for f in sent | set(required) if f not in rows and not f.endswith("."))
    ops_missing = sorted(f[:-1] for f in sent if f.endswith(".") and f not in rows)
    for f in missing:
        print("protocol_fields: conform sends %s, which docs/protocol.md's field tables do not list" % f)
    for op in ops_missing:
        print("protocol_fields: conform sends op %s, which docs/protocol.md's field tables do not list" % op)
    if missing or ops_missing:
        return 1
    print("protocol_fields: %d ops and %d fields sent (%d more named as flags-only), every one in the field tables"
          % (sum(f.endswith(".") for f in sent), sum(not f.endswith(".") for f in sent), len(set(required) - sent)))
    return 0


def selftest(doc):
    rows = documented(doc)
    if not rows:
        print("protocol_fields selftest: no field table in %s" % doc)
        return 1
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "fields")
        with open(log, "w") as f:
            f.write(sorted(rows)[0] + "\n")
        if check(log, doc, []) != 0:
            print("protocol_fields selftest: a documented field was refused")
            return 1
        with open(log, "a") as f:
            f.write("speculate.not_a_field_of_ours\n")
        if check(log, doc, []) != 1:
            print("protocol_fields selftest: an undocumented field passed")
            return 1
    print("protocol_fields selftest: an undocumented field fails the check, a documented one passes")
    return 0


def main(argv):
    if len(argv) >= 4 and argv[1] == "proxy" and argv[3] == "--":
        return proxy(argv[2], argv[4:])
    if len(argv) >= 4 and argv[1] == "check":
        required = []
        if "--require" in argv:
            required = [f for f in argv[argv.index("--require") + 1].split(",") if f]
        return check(argv[2], argv[3], required)
    if len(argv) == 3 and argv[1] == "selftest":
        return selftest(argv[2])
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
