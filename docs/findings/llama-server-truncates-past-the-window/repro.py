#!/usr/bin/env python3
"""Replays a failure tinygpt-verify found in an inference engine, without tinygpt.

This folder holds the model in the engine's format, requests.json (the requests, each with the logits
the reference model answers) and REPORT.md. The script starts the engine's command through /bin/sh -c,
speaks its line protocol (one JSON object per line on stdin and stdout: hello, load, then the
requests), compares every answer's logits with the stored ones and prints the first difference. A
`generate` (sequences the engine schedules itself) is judged by its ids: every sequence asked for, n
ids each, each id the reference's greedy choice or within twice the bound of it (a near tie, after
which that sequence is not judged further).

Exit 1 while the failure is there, 0 once every answer is within the bound, 2 when the engine cannot
be started, greeted or loaded. Python 3's standard library only.
"""
import argparse
import json
import os
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class Engine:
    def __init__(self, command, timeout):
        self.timeout = timeout
        self.proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=HERE)
        self.buf = b""

    def call(self, request):
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EngineGone("it closed its input (exit status %s)" % self.proc.poll())
        deadline = time.monotonic() + self.timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise EngineGone("no answer to %r within %g s" % (request.get("op"), self.timeout))
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EngineGone("it exited (status %s) without answering %r" % (self.proc.wait(), request.get("op")))
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            raise EngineGone("its answer to %r is not JSON: %.200r" % (request.get("op"), line))
        if not isinstance(answer, dict):
            raise EngineGone("its answer to %r is not a JSON object" % request.get("op"))
        return answer

    def close(self):
        try:
            self.proc.stdin.write(b'{"op": "quit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(timeout=5)
        except Exception:
            self.proc.kill()
            self.proc.wait()


class EngineGone(Exception):
    pass


def generate_wrong(answer, expect, bound):
    """What is wrong with a generate's answer against the reference's sequences, or None."""
    results = answer.get("results")
    if not isinstance(results, list):
        return "the answer has no \"results\""
    got = {}
    for r in results:
        if isinstance(r, dict):
            got[(r.get("id"), r.get("copy", 0))] = r.get("ids")
    for e in expect:
        name = "request %d%s" % (e["id"], " copy %d" % e["copy"] if e["copy"] else "")
        ids = got.get((e["id"], e["copy"]))
        if not isinstance(ids, list):
            return "%s did not come back" % name
        if len(ids) != e["n"]:
            return "%s came back with %d ids of the %d asked for" % (name, len(ids), e["n"])
        for i, (g, w) in enumerate(zip(ids, e["ids"])):
            if g == w:
                continue
            ties = dict((t[0], t[1]) for t in e["near"][i])
            if g in ties:
                break  # a near tie: either may be chosen, and the sequences part here
            return "%s chose id %r as its id %d where the reference chooses %d (the chosen one is not within %g of it)" % (
                name, g, i, w, 2 * bound)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", help="the engine's command line (default: the one the failure was found with)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for each answer (default 120)")
    args = ap.parse_args()
    with open(os.path.join(HERE, "requests.json")) as f:
        spec = json.load(f)
    bound, steps = spec["bound"], spec["steps"]
    engine = Engine(args.engine or spec["engine"], args.timeout)
    try:
        hello = engine.call({"op": "hello", "protocol": spec["protocol"]})
        load = dict(spec["load"], checkpoint=os.path.join(HERE, spec["load"]["checkpoint"]))
        loaded = engine.call(load)
    except EngineGone as e:
        print("repro: the engine could not be started: %s" % e)
        return 2
    for what, answer in (("hello", hello), ("load", loaded)):
        if not answer.get("ok"):
            print("repro: the engine answered %s with an error: %s" % (what, answer.get("error")))
            return 2
    print("repro: engine %r, %d requests (row %s of tinygpt conform), bound %g" % (hello.get("name"), len(steps), spec["row"], bound))
    rows, states = {}, {}
    where = "before the first request"

    def named(value):  # "@k" -> the id the engine gave that row; "@sK" -> the state it gave
        if isinstance(value, str) and value.startswith("@s"):
            return states[value]
        if isinstance(value, str) and value.startswith("@"):
            return rows[value]
        return value

    try:
        for i, step in enumerate(steps):
            where = "request %d of %d (%s)" % (i + 1, len(steps), step["says"])
            request = dict(step["request"])
            for key in ("row", "state"):
                if key in request:
                    request[key] = named(request[key])
            if "rows" in request:
                request["rows"] = [named(r) for r in request["rows"]]
            answer = engine.call(request)
            if not answer.get("ok"):
                print("FAIL %s: the engine refused it: %s" % (where, answer.get("error")))
                return 1
            if step.get("expect") is not None:
                wrong = generate_wrong(answer, step["expect"], bound)
                if wrong:
                    print("FAIL %s: %s" % (where, wrong))
                    return 1
            expected = step.get("logits")
            if expected is not None:
                got = answer.get("logits")
                if not isinstance(got, list) or len(got) != len(expected) or any(
                        not isinstance(g, list) or len(g) != len(e) for g, e in zip(got, expected)):
                    print("FAIL %s: the answer has no logits of %d rows of %d" % (where, len(expected), len(expected[0])))
                    return 1
                d, r, v = -1.0, 0, 0
                for i_row, (g, e) in enumerate(zip(got, expected)):
                    for i_id, (a, b) in enumerate(zip(g, e)):
                        x = abs(a - b) if isinstance(a, (int, float)) and not isinstance(a, bool) else float("inf")
                        x = float("inf") if x != x else x
                        if x > d:
                            d, r, v = x, i_row, i_id
                if not d <= bound:
                    print("FAIL %s: logit %d of answer row %d is %r where the reference has %.6g: |diff| %.3g > %g"
                          % (where, v, r, got[r][v], expected[r][v], d, bound))
                    return 1
            made = step.get("creates", [])
            if made:
                given = answer.get("rows") if request["op"] == "prefill" else [answer.get("row")]
                if isinstance(given, list) and len(given) == len(made):
                    rows.update(zip(made, given))
            if step.get("saves"):
                states[step["saves"]] = answer.get("state")
    except EngineGone as e:
        print("FAIL %s: the engine stopped answering: %s" % (where, e))
        return 1
    except KeyError as e:
        print("FAIL %s: an earlier answer gave no id for %s" % (where, e))
        return 1
    finally:
        engine.close()
    print("PASS: all %d answers are within %g of the reference: the failure is gone" % (len(steps), bound))
    return 0


if __name__ == "__main__":
    sys.exit(main())
