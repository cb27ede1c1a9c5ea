#!/usr/bin/env python3
"""Our RoPE for the zoo (lib rope_scaling.h, SPEC 10) against transformers 5.12's own, spec by spec:
the inverse frequencies each model class multiplies positions by, the factor it multiplies cos and
sin by (YaRN's attention factor), and a probe tensor rotated by the model's own apply_rotary_pos_emb
at positions inside the window, at its edge and far past it - for the default rotation at several
bases and head sizes, partial rotary, linear, llama3 and YaRN scaling, with original contexts below
our 256-token window as the zoo's members have them. Then the same comparison against our answers
with a known engine bug planted (YaRN's attention factor dropped, llama3's factors not applied, a
partial rotation applied to the whole head, adjacent pairs where the model pairs halves): each must
be caught on exactly the specs it touches, or the comparison proves nothing.

  rope_scaling_vs_transformers.py ROPE_DUMP WORK_DIR
Exit 0: every frequency within 2 float32 ulps (relative 2.4e-7), every rotated value within 2e-6 plus
what the frequencies' own difference explains at the probe's last position, and every plant caught;
1 otherwise;
77 (ctest's skip) when the forky chroot (ci/forky.sh) is not there, saying why.
"""
import json
import os
import subprocess
import sys

from zoo_common import SKIP, plants_caught, transformers_answer

REL_TOL = 2.4e-7  # two float32 ulps of 1: the same operations in another build of LibTorch
FACTOR_TOL = 1e-12
ROTATED_TOL = 2e-6  # |values| <= ~1.6: cos and sin of angles up to 4095 rad in two builds of LibTorch
MAX_POSITION = 4095  # hf_rope.py's largest probe position

SPECS = [
    {"name": "seed (theta 1e4, hd 64)", "theta": 10000.0, "head_dim": 64},
    {"name": "qwen3 base (theta 1e6, hd 48)", "theta": 1000000.0, "head_dim": 48},
    {"name": "hd 128, theta 5e5", "theta": 500000.0, "head_dim": 128},
    {"name": "partial 25% (neox)", "theta": 10000.0, "head_dim": 64, "partial_rotary": 0.25},
    {"name": "partial 50%, hd 48", "theta": 10000.0, "head_dim": 48, "partial_rotary": 0.5},
    {"name": "linear x2", "head_dim": 64, "scaling": {"kind": "linear", "factor": 2.0}},
    {"name": "linear x4, hd 32", "head_dim": 32, "scaling": {"kind": "linear", "factor": 4.0}},
    {"name": "llama3 x8, C 8192 (Llama 3.1)", "theta": 500000.0, "head_dim": 64,
     "scaling": {"kind": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 8192}},
    {"name": "llama3 x4, C 128 (the zoo's llama)", "theta": 10000.0, "head_dim": 64,
     "scaling": {"kind": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 128}},
    {"name": "llama3 x2, C 64, hd 48", "theta": 10000.0, "head_dim": 48,
     "scaling": {"kind": "llama3", "factor": 2.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0, "original_context": 64}},
    {"name": "yarn x4, C 64 (the zoo's qwen3)", "theta": 1000000.0, "head_dim": 48,
     "scaling": {"kind": "yarn", "factor": 4.0, "original_context": 64}},
    {"name": "yarn x4, C 64, theta 1e4", "theta": 10000.0, "head_dim": 64,
     "scaling": {"kind": "yarn", "factor": 4.0, "original_context": 64}},
    {"name": "yarn x2, C 128, attention factor given", "theta": 10000.0, "head_dim": 64,
     "scaling": {"kind": "yarn", "factor": 2.0, "original_context": 128, "attention_factor": 1.25}},
    {"name": "yarn x8, C 32, no truncation, betas 16/2", "theta": 10000.0, "head_dim": 64,
     "scaling": {"kind": "yarn", "factor": 8.0, "original_context": 32, "truncate": False, "beta_fast": 16.0, "beta_slow": 2.0}},
]
PLANTS = {  # our answer with an engine's bug in it: the specs it must change
    "yarn-attention-factor-missing": [s["name"] for s in SPECS if s.get("scaling", {}).get("kind") == "yarn"
                                      and s["scaling"].get("attention_factor", 2.0) != 1.0],
    "llama3-factors-missing": [s["name"] for s in SPECS if s.get("scaling", {}).get("kind") == "llama3"],
    "partial-rotary-rotates-all": [s["name"] for s in SPECS if s.get("partial_rotary", 1.0) != 1.0],
    "pairing-adjacent": [s["name"] for s in SPECS],
}


def ours(dump, specs_path, plant=None):
    cmd = [dump, specs_path] + (["--plant", plant] if plant else [])
    return {r["name"]: r for r in json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)}


def differences(mine, theirs):
    """name -> what differs (empty: within the tolerance)."""
    out = {}
    for name, t in theirs.items():
        m = mine.get(name)
        if m is None or "error" in m or "error" in t:
            out[name] = "ours: %s; transformers: %s" % (m and m.get("error", "ok"), t.get("error", "ok"))
            continue
        a, b = m["inv_freq"], t["inv_freq"]
        if len(a) != len(b):
            out[name] = "%d frequencies against %d" % (len(a), len(b))
            continue
        rel = max((abs(x - y) / abs(y) if y else abs(x)) for x, y in zip(a, b))
        exact = sum(1 for x, y in zip(a, b) if x == y)
        df = abs(m["attention_factor"] - t["attention_factor"])
        ra, rb = m["rotated"], t["rotated"]
        rot = max(abs(x - y) for x, y in zip(ra, rb)) if len(ra) == len(rb) else float("inf")
        # A frequency an ulp apart (kernels of two LibTorch versions) turns a pair of |x| <= 2 by
        # position x that much more: the rotation is held to what the measured frequencies explain.
        rot_tol = ROTATED_TOL + 2 * MAX_POSITION * max(abs(x - y) for x, y in zip(a, b))
        if rel > REL_TOL or df > FACTOR_TOL or rot > rot_tol:
            out[name] = "inv_freq relative diff %.2e (%d of %d equal), attention factor %.6f against %.6f, rotated |diff| %.2e (bound %.1e)" % (
                rel, exact, len(a), m["attention_factor"], t["attention_factor"], rot, rot_tol)
        else:
            out[name] = ""
            t["_report"] = "%d of %d frequencies bit-equal (largest relative diff %.1e), attention factor %.6f, rotated |diff| %.1e (bound %.1e)" % (
                exact, len(a), rel, t["attention_factor"], rot, rot_tol)
    return out


def main():
    dump, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    specs_path = os.path.join(work, "specs.json")
    with open(specs_path, "w") as f:
        json.dump(SPECS, f)
    doc = transformers_answer("hf_rope.py", json.dumps(SPECS))
    if isinstance(doc, str):
        print("skipped: " + doc)
        return SKIP
    theirs = {r["name"]: r for r in doc["rows"]}
    failed = False
    diffs = differences(ours(dump, specs_path), theirs)
    print("against transformers %s:" % doc["transformers"])
    for name in (s["name"] for s in SPECS):
        print("  %-45s %s" % (name, ("DIFFERS: " + diffs[name]) if diffs[name] else "ok: " + theirs[name]["_report"]))
        failed |= bool(diffs[name])

    def differing(plant):
        planted = differences(ours(dump, specs_path, plant), {k: dict(v) for k, v in theirs.items()})
        return [n for n, why in planted.items() if why]
    failed |= not plants_caught(PLANTS, differing)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
