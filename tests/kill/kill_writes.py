#!/usr/bin/env python3
"""Interrupted writes: `golden update`, `convert` and `train` killed with SIGKILL
at seeded random moments leave every file they write either as it was before or as a whole new
file, never torn; and `train --resume` after each kill carries on to exactly the weights (bit for
bit) and log rows of a run that was never stopped.

  kill_writes.py TINYGPT GOLDEN_DIR WORK_DIR [--kills N] [--golden-kills N] [--seed S] [--only selftest,train,convert,golden]

Each part first runs the command to its end to learn its duration and its output, then kills fresh
runs at moments drawn over that duration. Prints one line per kill and exits 1 on any violation.
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

failures = []
planted = False  # the self-test's findings are expected: printed as caught, not as failures


def fail(msg):
    failures.append(msg)
    print(f"kill-test: {'caught (planted)' if planted else 'FAIL'} {msg}", flush=True)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def safetensors_tensors(path):
    """The tensors of a complete safetensors file as {name: (dtype, shape, bytes)}; raises on a torn one."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("shorter than its header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("header runs past the end")
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out, end = {}, 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        end = max(end, b)
        out[name] = (t["dtype"], tuple(t["shape"]), body[a:b])
    if end != len(body):
        raise ValueError(f"data ends at {end}, file body is {len(body)} bytes")
    return out


def run_and_kill(cmd, delay, watch=None, nth=0, after=0.0, env=None, prefix=""):
    """Start cmd and SIGKILL it: `delay` seconds after the start, or, with `watch` (a folder) and
    nth >= 1, `after` seconds after the nth temporary file (NAME.tmp.PID, NAME starting with
    `prefix`) appears there, which puts the kill inside a write. Returns (killed, when): whether it
    was killed, seconds after the start."""
    def temporaries():
        try:
            return {n for n in os.listdir(watch) if ".tmp." in n and n.startswith(prefix)}
        except FileNotFoundError:
            return set()

    before = temporaries() if watch else set()  # a killed run's leftovers are not this run's writes
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    seen = set()
    while p.poll() is None:
        now = time.monotonic() - t0
        if watch is None and now >= delay:
            break
        if watch is not None:
            seen |= temporaries() - before
            if len(seen) >= nth:
                time.sleep(after)
                break
        time.sleep(0.0005)
    if p.poll() is not None:
        return False, time.monotonic() - t0
    p.send_signal(signal.SIGKILL)
    p.wait()
    return True, time.monotonic() - t0


def kill_plan(rng, kills, took, writes):
    """Half the kills at random moments of the run, half just after its kth temporary file appears
    (k cycling through 1..writes), a random 0-20 ms into the write."""
    plan = []
    for i in range(kills):
        if i % 2 == 0:
            plan.append({"delay": rng.uniform(0.05, took)})
        else:
            plan.append({"delay": None, "nth": (i // 2) % writes + 1, "after": rng.uniform(0.0, 0.02)})
    return plan


def describe(killed, when, k):
    how = f"at {when:.2f} s" if k["delay"] is not None else f"{k['after'] * 1e3:.0f} ms into temporary file {k['nth']} ({when:.2f} s)"
    return ("killed " if killed else "ended before the kill, ") + how


def timed_run(cmd, env=None):
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"kill-test: {' '.join(cmd)} failed uninterrupted (exit {r.returncode}):\n{r.stdout[-2000:]}")
    return time.monotonic() - t0


def part_golden(a, rng):
    names = ["greedy_600.json", "sample_grid.json", "sampler_selfcheck.json"]
    ref = os.path.join(a.work, "golden-ref")
    shutil.rmtree(ref, ignore_errors=True)
    shutil.copytree(a.golden, ref)

    def cmd(d):
        return [a.tinygpt, "golden", "update", "--dir", d, "--checkpoint", os.path.join(d, "fixture.safetensors"),
                "--tokenizer", os.path.join(d, "tokenizer.json"), "--threads", "2"]

    # golden update refuses under CI=true, which guards the shipped goldens; these runs write
    # scratch copies under the build folder, so the variable is dropped for them alone.
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    old = {n: digest(os.path.join(a.golden, n)) for n in names}
    took = timed_run(cmd(ref), env)
    new = {n: digest(os.path.join(ref, n)) for n in names}
    if old == new:
        raise SystemExit("kill-test: golden update wrote the shipped bytes again: old and new cannot be told apart")
    print(f"kill-test: golden update takes {took:.1f} s uninterrupted", flush=True)
    run = os.path.join(a.work, "golden-kill")
    for k in kill_plan(rng, a.golden_kills, took, len(names)):
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(a.golden, run)
        killed, when = run_and_kill(cmd(run), k["delay"], None if k["delay"] is not None else run, k.get("nth", 0),
                                    k.get("after", 0), env)
        states = []
        for n in names:
            h = digest(os.path.join(run, n))
            states.append("old" if h == old[n] else "new" if h == new[n] else "TORN")
            if states[-1] == "TORN":
                fail(f"golden update {describe(killed, when, k)}: {n} is neither the old file nor the new one")
        print(f"kill-test: golden update {describe(killed, when, k)}: " + ", ".join(f"{n} {s}" for n, s in zip(names, states)),
              flush=True)


def kill_one_file_writer(label, cmd, out, watch, a, rng):
    """Runs cmd (which writes `out`) to its end twice, then kills it per the plan with other bytes
    at `out` beforehand; each time `out` must hold the old bytes or the new ones."""
    timed_run(cmd)
    new = digest(out)
    took = timed_run(cmd)
    if digest(out) != new:
        raise SystemExit(f"kill-test: {label} is not deterministic: old and new cannot be told apart")
    # The old file: other bytes at the same path (the new file with its last byte changed).
    with open(out, "rb") as f:
        old_bytes = f.read()
    old_bytes = old_bytes[:-1] + bytes([old_bytes[-1] ^ 0xFF])
    old = hashlib.sha256(old_bytes).hexdigest()
    print(f"kill-test: {label} takes {took:.2f} s uninterrupted", flush=True)
    for k in kill_plan(rng, a.kills, took, 1):
        with open(out, "wb") as f:
            f.write(old_bytes)
        killed, when = run_and_kill(cmd, k["delay"], None if k["delay"] is not None else watch, k.get("nth", 0),
                                    k.get("after", 0))
        h = digest(out)
        state = "old" if h == old else "new" if h == new else "TORN"
        if state == "TORN":
            fail(f"{label} {describe(killed, when, k)}: the output is neither the old file nor the new one")
        print(f"kill-test: {label} {describe(killed, when, k)}: output {state}", flush=True)


def part_convert(a, rng):
    out = os.path.join(a.work, "convert-out.pt")
    kill_one_file_writer("convert", [a.tinygpt, "convert", os.path.join(a.golden, "fixture.safetensors"), out], out,
                         a.work, a, rng)


def part_selftest(a, rng):
    """The harness must see a torn file: a writer that writes in place (no temporary, no rename),
    in chunks over about a second, killed at random moments, must be reported."""
    out = os.path.join(a.work, "selftest-out.bin")
    writer = ("import sys, time\n"
              "with open(sys.argv[1], 'wb') as f:\n"
              "    for i in range(20):\n"
              "        f.write(bytes([i]) * 65536); f.flush(); time.sleep(0.05)\n")
    global planted
    before, planted = len(failures), True
    kill_one_file_writer("in-place writer (planted)", [sys.executable, "-c", writer, out], out, a.work, a, rng)
    caught, planted = len(failures) - before, False
    del failures[before:]
    if caught == 0:
        fail("self-test: a writer that writes in place was killed and no torn file was reported")
    else:
        print(f"kill-test: self-test: the planted in-place writer left {caught} torn file(s), each reported", flush=True)


def check_train_dir(d, when):
    """Every file a kill can leave behind is whole: the state file parses and names whole files."""
    state = os.path.join(d, "train_state.json")
    for n in ("last.safetensors", "best.safetensors"):
        p = os.path.join(d, n)
        if os.path.exists(p):
            try:
                safetensors_tensors(p)
            except Exception as e:  # noqa: BLE001 - any parse error is the finding
                fail(f"train killed {when}: {n} is torn ({e})")
    if os.path.exists(state):
        try:
            with open(state) as f:
                st = json.load(f)
            safetensors_tensors(os.path.join(d, st["weights"]))
            if os.path.getsize(os.path.join(d, st["optim"])) == 0:
                raise ValueError("empty optimizer file")
            return st["step"]
        except Exception as e:  # noqa: BLE001
            fail(f"train killed {when}: the resume state is not whole ({e})")
    return 0


def log_rows(d):
    """train_log.csv without the timing columns: step, lr, train loss, validation loss."""
    with open(os.path.join(d, "train_log.csv")) as f:
        lines = f.read().splitlines()
    return [tuple(line.split(",")[:4]) for line in lines[1:]]


def part_train(a, rng):
    corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
    base = [a.tinygpt, "train", "--corpus", corpus, "--tokenizer", os.path.join(a.golden, "tokenizer.json"),
            "--steps", str(a.train_steps), "--batch", "2", "--eval-every", "4", "--seed", "7", "--threads", "2"]
    ref = os.path.join(a.work, "train-ref")
    shutil.rmtree(ref, ignore_errors=True)
    took = timed_run(base + ["--out", ref])
    want = safetensors_tensors(os.path.join(ref, "last.safetensors"))
    print(f"kill-test: train ({a.train_steps} steps) takes {took:.1f} s uninterrupted", flush=True)
    run = os.path.join(a.work, "train-kill")
    shutil.rmtree(run, ignore_errors=True)
    resumed_from = []
    # Each run resumes from the last; kills land at random moments or inside the checkpoint writes.
    # Write kills count this run's temporary files in resume/: the 1st and 2nd are the first new
    # generation's weights and optimizer, the 3rd the next generation's weights, so by then one
    # generation is committed and the resume state must have moved on.
    for i, k in enumerate(kill_plan(rng, a.kills, took / 2, 3)):
        cmd = base + ["--out", run] + (["--resume"] if i else [])
        os.makedirs(os.path.join(run, "resume"), exist_ok=True)
        watch = None if k["delay"] is not None else os.path.join(run, "resume")
        killed, when = run_and_kill(cmd, k["delay"], watch, k.get("nth", 0), k.get("after", 0))
        step = check_train_dir(run, describe(killed, when, k))
        resumed_from.append(step)
        print(f"kill-test: train run {i + 1} {describe(killed, when, k)}; its resume state is at step {step}", flush=True)
    # One kill just after a generation is committed, as last.safetensors is copied: the log row of
    # the step that generation covers must already be written (it once came after the copy).
    killed, when = run_and_kill(base + ["--out", run, "--resume"], None, run, 1, 0.0, prefix="last.safetensors.tmp.")
    step = check_train_dir(run, "killed as last.safetensors was copied")
    print(f"kill-test: train run {a.kills + 1} {'killed' if killed else 'ended before the kill'} as last.safetensors "
          f"was copied ({when:.2f} s); its resume state is at step {step}", flush=True)
    r = subprocess.run(base + ["--out", run, "--resume"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        fail(f"train --resume after the kills failed (exit {r.returncode}): {r.stdout[-500:]}")
        return
    got = safetensors_tensors(os.path.join(run, "last.safetensors"))
    differ = [n for n in want if got.get(n) != want[n]]
    if differ or set(got) != set(want):
        fail(f"train resumed after {a.kills} kills ends with other weights than an uninterrupted run: "
             f"{len(differ)} tensors differ (first {differ[:3]})")
    else:
        print(f"kill-test: train resumed after kills (states at steps {resumed_from}) ends bit-identical to the "
              f"uninterrupted run: {len(got)} tensors", flush=True)
    if log_rows(run) != log_rows(ref):
        fail("train_log.csv after the kills differs from the uninterrupted run's (step, lr, losses)")
    if not any(s > 0 for s in resumed_from):
        fail("no kill left a resume state: the kills all landed before the first validation")
    # A kill while the final step's last.safetensors is copied leaves the resume state at the last
    # step and last.safetensors one generation behind; --resume then has no step to run and must
    # still bring last.safetensors up to date (the random kills above hit this only by chance).
    stale = os.path.join(a.work, "train-stale")
    shutil.rmtree(stale, ignore_errors=True)
    shutil.copytree(ref, stale)
    shutil.copyfile(os.path.join(a.golden, "fixture.safetensors"), os.path.join(stale, "last.safetensors"))
    r = subprocess.run(base + ["--out", stale, "--resume"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    got = safetensors_tensors(os.path.join(stale, "last.safetensors"))
    if r.returncode != 0 or got != want:
        fail(f"train --resume of a finished run left a stale last.safetensors (exit {r.returncode})")
    else:
        print("kill-test: --resume of a finished run brings a stale last.safetensors up to date", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tinygpt")
    ap.add_argument("golden")
    ap.add_argument("work")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=24, help="steps of each train run (a validation every 4)")
    ap.add_argument("--golden-kills", type=int, default=4, help="kills of golden update (each run takes ~30 s)")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--only", default="selftest,train,convert,golden")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rng = random.Random(a.seed)
    parts = {"selftest": part_selftest, "golden": part_golden, "convert": part_convert, "train": part_train}
    for name in a.only.split(","):
        parts[name](a, rng)
    if failures:
        print(f"kill-test: {len(failures)} violation(s)", flush=True)
        sys.exit(1)
    print("kill-test: every interrupted write left the old file or the new one; resume is exact", flush=True)


if __name__ == "__main__":
    main()
