#!/usr/bin/env python3
"""The command line names the BLAS core it runs on, replaces a fallback older than the CPU with the
core that matches it (saying so in one line), obeys TINYGPT_BLAS_CORE, refuses a core or a kernel
path this CPU cannot run, and runs the model with OpenMP waiting passively.

usage: blas_choice.py TINYGPT"""
import os
import re
import subprocess
import sys

TOOL = sys.argv[1]
failures = []


def run(env_extra, *args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "TINYGPT_BLAS_CORE", "TINYGPT_KERNELS", "OMP_WAIT_POLICY")}
    env.update(env_extra)
    return subprocess.run([TOOL, *args], env=env, capture_output=True, text=True, timeout=120)


def expect(cond, what, p):
    if not cond:
        failures.append(f"{what}\n  exit {p.returncode}\n  stdout: {p.stdout!r}\n  stderr: {p.stderr!r}")


def core_of(p):
    m = re.search(r"core (\w+) \(chosen by ([^\n]*)\)", p.stdout)
    return (m.group(1), m.group(2)) if m else (None, None)


plain = run({}, "--version")
expect(plain.returncode == 0 and "BLAS: OpenBLAS" in plain.stdout, "--version names the BLAS", plain)
core, _ = core_of(plain)
if core is None:
    print(f"SKIP: LibTorch here does not run on OpenBLAS: {plain.stdout.strip()}")
    sys.exit(0)
flags = open("/proc/cpuinfo").read()
avx2 = " avx2 " in flags and " fma " in flags

forced = run({"TINYGPT_BLAS_CORE": "Prescott"}, "--version")
expect(core_of(forced) == ("Prescott", "TINYGPT_BLAS_CORE"), "TINYGPT_BLAS_CORE forces a core", forced)

user = run({"OPENBLAS_CORETYPE": "Prescott"}, "--version")
expect(core_of(user) == ("Prescott", "OPENBLAS_CORETYPE"), "a user's OPENBLAS_CORETYPE is kept", user)

if avx2:
    fixed = run({"OPENBLAS_CORETYPE": "Prescott", "TINYGPT_BLAS_CORE": "auto"}, "--version")
    got, by = core_of(fixed)
    expect(got not in (None, "Prescott") and by.startswith("tinygpt: OpenBLAS had chosen its Prescott kernels"),
           "a Prescott fallback on an AVX2 CPU is replaced and the report says by whom", fixed)
    notes = [l for l in fixed.stderr.splitlines() if "running with its" in l]
    expect(len(notes) == 1 and got in notes[0], "the replacement is said in one line on stderr", fixed)
    kept = run({"OPENBLAS_CORETYPE": "Prescott", "TINYGPT_BLAS_CORE": "openblas"}, "--version")
    expect(core_of(kept)[0] == "Prescott" and not kept.stderr, "TINYGPT_BLAS_CORE=openblas keeps OpenBLAS's choice", kept)
else:
    print("note: this CPU has no AVX2/FMA, so a Prescott choice is not a fallback here")

for bad in ("Foo", "SkylakeX" if " avx512f " not in flags else "NoSuchCore"):
    p = run({"TINYGPT_BLAS_CORE": bad}, "--version")
    expect(p.returncode == 2 and p.stderr.count("\n") == 1 and "TINYGPT_BLAS_CORE" in p.stderr,
           f"TINYGPT_BLAS_CORE={bad} is refused in one line, exit 2", p)
p = run({"TINYGPT_KERNELS": "avx9"}, "--version")
expect(p.returncode == 2 and "avx9" in p.stderr and p.stderr.count("\n") == 1, "an unknown kernel path is refused", p)
p = run({"TINYGPT_KERNELS": "portable"}, "--version")
expect(p.returncode == 0 and "decode kernels: portable" in p.stdout, "TINYGPT_KERNELS=portable is in force", p)

# The model-running process waits passively: an engine it starts inherits its environment.
import tempfile
with tempfile.TemporaryDirectory() as tmp:
    seen = os.path.join(tmp, "env")
    engine = f"echo \"$OMP_WAIT_POLICY\" > {seen}"
    p = run({}, "conform", "--engine", engine, "--timeout", "20")
    got = open(seen).read().strip() if os.path.exists(seen) else None
    expect(p.returncode == 2 and got == "PASSIVE", f"tinygpt runs (and starts engines) with OMP_WAIT_POLICY=PASSIVE (saw {got!r})", p)

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print(f"ok: BLAS core {core}, every choice obeyed")
