#!/usr/bin/env python3
"""After tinygpt re-executes itself to set OpenMP's wait policy (cli/runtime.cpp), the process is still
named after the tool: `ps`, `top` and `pgrep tinygpt` find it (executing /proc/self/exe named it "exe").

  process_name.py TINYGPT
"""
import os
import subprocess
import sys
import time


def main():
    tinygpt = sys.argv[1]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TINYGPT_PREPARED")}
    # Long enough to be looked at: the uncached loop, untrained weights, many tokens.
    p = subprocess.Popen([tinygpt, "generate", "--uncached", "--tokens", "100000", "--threads", "1"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        name, environ = "", b""
        while time.time() < deadline:
            time.sleep(0.2)
            try:
                environ = open("/proc/%d/environ" % p.pid, "rb").read()
                name = open("/proc/%d/comm" % p.pid).read().strip()
            except OSError:
                break
            if b"OMP_WAIT_POLICY=PASSIVE" in environ:  # the re-executed process: the policy is set
                break
        if b"OMP_WAIT_POLICY=PASSIVE" not in environ:
            print("FAIL: the process never re-executed itself with OMP_WAIT_POLICY set (exit %s): %s" % (p.poll(), p.stderr.read() if p.poll() is not None else ""))
            return 1
        pgrep = subprocess.run(["pgrep", "-x", "tinygpt"], capture_output=True, text=True).stdout.split()
        print("after re-executing itself the process is named %r; pgrep -x tinygpt finds %s" % (name, pgrep))
        if name != "tinygpt" or str(p.pid) not in pgrep:
            print("FAIL: expected the name 'tinygpt' and pgrep to find pid %d" % p.pid)
            return 1
        return 0
    finally:
        p.kill()
        p.wait()


if __name__ == "__main__":
    sys.exit(main())
