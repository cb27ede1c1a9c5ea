#!/usr/bin/env python3
"""The zoo's building blocks (lib zoo_ops.h, SPEC 10) against transformers 5.12's own modules on the
same probes: Llama's RMSNorm, Gemma 2's (1 + w) RMSNorm, the SiLU- and GELU-tanh-gated MLPs, and
Gemma 2's eager attention with grouped KV heads (6 query heads over 2, and over 1), its own scale and
its soft-cap. Then our answers with a known engine bug planted - Gemma's (1 + w) applied twice (vLLM
PR #31464), the attention soft-cap missing (llama.cpp PR #8197), query heads reading KV head h % G
instead of h / group - each must be caught on exactly the cases it touches.

  zoo_ops_vs_transformers.py ZOO_OPS_DUMP
Exit 0: every value within 2e-6 of transformers' (two BLAS builds: sums in other orders) and every
plant caught; 1 otherwise; 77 (ctest's skip) when the forky chroot (ci/forky.sh) is not there.
"""
import json
import subprocess
import sys

from zoo_common import SKIP, plants_caught, transformers_answer

TOL = 2e-6
PLANTS = {
    "norm-plus-one-twice": ["rmsnorm_plus_one"],
    "softcap-missing": ["attention_gqa_softcap"],
    "gqa-heads-interleaved": ["attention_gqa", "attention_gqa_softcap"],
}


def ours(dump, plant=None):
    cmd = [dump] + (["--plant", plant] if plant else [])
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def apart(mine, theirs):
    """case -> the largest |diff|."""
    return {k: (max(abs(a - b) for a, b in zip(mine[k], v)) if len(mine.get(k, [])) == len(v) else float("inf"))
            for k, v in theirs.items()}


def main():
    dump = sys.argv[1]
    doc = transformers_answer("hf_ops.py")
    if isinstance(doc, str):
        print("skipped: " + doc)
        return SKIP
    theirs = doc["cases"]
    failed = False
    print("against transformers %s:" % doc["transformers"])
    for case, d in apart(ours(dump), theirs).items():
        print("  %-24s %s |diff| %.1e (bound %.0e, %d values)" % (case, "ok:" if d <= TOL else "DIFFERS:", d, TOL, len(theirs[case])))
        failed |= d > TOL
    failed |= not plants_caught(PLANTS, lambda plant: [k for k, d in apart(ours(dump, plant), theirs).items() if d > TOL])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
