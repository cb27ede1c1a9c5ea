#!/usr/bin/env python3
"""`--checkpoint DIR` (lib hf_checkpoint.h) against transformers itself: in the forky chroot transformers
5.12 writes a randomly initialised LlamaForCausalLM, MistralForCausalLM, Qwen3ForCausalLM,
Gemma2ForCausalLM and GPTNeoXForCausalLM (hf_models.py: head_dim 48, 3 KV heads of 6, 5 layers, a
sliding window of 8, llama3 and YaRN scaling acting inside the prompt, soft-caps that bind; the Llama
again as bfloat16 weights in shards, computed in float32) and its
own logits for a 40-token prompt; our loader reads each directory and our model's logits must equal
them within 1e-4 at every position. Then six converter bugs planted in what our loader read - each
must be caught on exactly the members with that feature.

  hf_vs_transformers.py ZOO_HF_DUMP
The models are written under $TMPDIR (the one folder the chroot shares by its own path) and removed.
Exit 0 when all hold; 1 otherwise; 77 (ctest's skip) when the forky chroot (ci/forky.sh) is not there.
"""
import json
import os
import sys
import tempfile

from zoo_common import SKIP, ours_logits, plants_caught, transformers_answer

TOL = 1e-4
PLANTS = {
    "no-sliding": ["gemma2", "mistral"],
    "no-softcap": ["gemma2"],
    "no-qk-norm": ["qwen3"],
    "full-rotary": ["neox"],
    "no-rope-scaling": ["llama", "llama-bf16-sharded", "qwen3"],
    "sequential-residual": ["neox"],
}


def apart(mine, theirs):
    if mine is None or len(mine) != len(theirs):
        return float("inf")
    return max(abs(a - b) for r, s in zip(mine, theirs) for a, b in zip(r, s))


def main():
    dump = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="tinygpt-hf-") as work:
        return judge(dump, work)


def judge(dump, work):
    doc = transformers_answer("hf_models.py", work)
    if isinstance(doc, str):
        print("SKIP:", doc)
        return SKIP
    versions = doc.pop("_versions")
    print("transformers %s, torch %s in the forky chroot" % (versions["transformers"], versions["torch"]))
    ok = True
    # Every member as read, then with each plant: one process for all of them.
    names = sorted(doc)
    cases = [(n, plant) for plant in [None] + list(PLANTS) for n in names]
    answers = dict(zip(cases, ours_logits(dump, [(os.path.join(work, n), doc[n]["ids"], plant) for n, plant in cases])))
    for name in names:
        theirs = doc[name]
        if "sharded" in name:  # the directory is what it says: an index and several shards
            files = os.listdir(os.path.join(work, name))
            shards = [f for f in files if f.startswith("model-") and f.endswith(".safetensors")]
            if "model.safetensors.index.json" not in files or len(shards) < 2:
                print("  %s: not sharded (%s)" % (name, ", ".join(sorted(files))))
                ok = False
            else:
                print("  %s: %d shards" % (name, len(shards)))
        mine, err = answers[(name, None)]
        d = apart(mine, theirs["logits"])
        good = d <= TOL
        ok &= good
        print("  %-8s %-20s max |ours - transformers| = %s (logits up to %.1f)%s" % (
            name, theirs["class"], "%.2e" % d if d != float("inf") else "-",
            max(abs(x) for r in theirs["logits"] for x in r), "" if good else "  FAIL " + err))

    def differing(plant):
        return [n for n, t in doc.items() if apart(answers[(n, plant)][0], t["logits"]) > TOL]

    ok &= plants_caught(PLANTS, differing)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
