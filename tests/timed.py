#!/usr/bin/env python3
"""Runs one test's command and records what it cost: wall seconds and the CPU seconds of the command
and every process it waited for (os.wait4's rusage). ctest records wall time only; on a 2-core CI
machine a test that keeps two threads busy costs twice its wall time, so the budget is read in both.

  timed.py OUT_DIR NAME -- COMMAND...     (NAME '@gtest': the binary's name and its --gtest_filter)

Writes OUT_DIR/NAME.json {"name", "wall_s", "cpu_s", "rc"}; stdout, stderr and the exit status are
the command's own (a skip code or a PASS_REGULAR_EXPRESSION still reaches ctest). ci/test-times.py
reads these files beside ctest's JUnit report.
"""
import json
import os
import signal
import subprocess
import sys
import time


def test_name(name, cmd):
    if name != "@gtest":
        return name
    if "--gtest_list_tests" in cmd:
        return None  # gtest_discover_tests asking what is there: not a test
    # gtest_discover_tests runs "BINARY --gtest_filter=Suite.Case ...": ctest names it BINARY.Suite.Case.
    flt = next((a.split("=", 1)[1] for a in cmd if a.startswith("--gtest_filter=")), None)
    return None if flt is None else os.path.basename(cmd[0]) + "." + flt


def main():
    argv = sys.argv[1:]
    split = argv.index("--")
    out_dir, name, cmd = argv[0], argv[1], argv[split + 1:]
    name = test_name(name, cmd)
    start = time.monotonic()
    proc = subprocess.Popen(cmd)
    # ctest stops a test past its TIMEOUT by killing it (and what it started): pass a signal on.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda sig, _f: proc.send_signal(sig))
    while True:
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            break
        except ChildProcessError:
            status, usage = 0, None
            break
        except InterruptedError:
            continue
    rc = os.waitstatus_to_exitcode(status)
    if name is not None and usage is not None:  # gtest's discovery (--gtest_list_tests) is not a test
        os.makedirs(out_dir, exist_ok=True)
        record = {"name": name, "wall_s": round(time.monotonic() - start, 3),
                  "cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "rc": rc}
        tmp = os.path.join(out_dir, ".%s.%d.tmp" % (name.replace("/", "_"), os.getpid()))
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, os.path.join(out_dir, name.replace("/", "_") + ".json"))
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
