#!/usr/bin/env python3
"""`tinygpt export --format hf` against transformers itself: every zoo member (golden/zoo/NAME) is written
as a Hugging Face directory, transformers 5.12 in the forky chroot loads it as its own class
(AutoModelForCausalLM: Llama, Mistral, Qwen3, Gemma2, GPTNeoX) and runs it on a 100-token prompt (past
the 64-token sliding windows and the RoPE scalings' original contexts); its logits must equal our
model's on the member's own checkpoint within 1e-4 at every position, the class must be the one the
member maps to, and the hyper-parameters transformers read must be the member's. The seed's fixture,
whose adjacent RoPE pairs no class carries, must be refused by name (exit 2).

  zoo_export_vs_transformers.py TINYGPT ZOO_HF_DUMP
Exit 0 when all hold; 1 otherwise; 77 when the forky chroot (ci/forky.sh) is not there.
"""
import json
import os
import subprocess
import sys
import tempfile

from zoo_common import ROOT, SKIP, ours_logits, plants_caught, transformers_answer

TOL = 1e-4
CLASSES = {"llama": "LlamaForCausalLM", "mqa": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
           "gemma2": "Gemma2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "neox": "GPTNeoXForCausalLM"}


def main():
    tinygpt, dump = sys.argv[1], sys.argv[2]
    zoo = os.path.join(ROOT, "golden", "zoo")
    members = [m for m in CLASSES if os.path.isfile(os.path.join(zoo, m, "model.safetensors"))]
    if not members:
        print("SKIP: no trained zoo member in golden/zoo")
        return SKIP
    ok = True
    refused = subprocess.run([tinygpt, "export", "--format", "hf", os.path.join(tempfile.gettempdir(), "tinygpt-never-written")],
                             capture_output=True, text=True)
    good = refused.returncode == 2 and "rope_pairing" in refused.stderr
    print("  the seed's fixture: %s" % ("refused: " + refused.stderr.strip() if good else "NOT refused as it must be: %r" % refused.stderr))
    ok &= good
    ids = [(7 * i + 3) % 4096 for i in range(100)]
    with tempfile.TemporaryDirectory(prefix="tinygpt-hf-export-") as work:
        dirs = {}
        for m in members:
            d = os.path.join(work, m)
            run = subprocess.run([tinygpt, "export", "--format", "hf", "--checkpoint", os.path.join(zoo, m, "model.safetensors"), d],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                print("  %-8s export failed: %s" % (m, run.stderr.strip()))
                ok = False
                continue
            dirs[m] = d
        doc = transformers_answer("hf_load.py", ",".join(map(str, ids)), *dirs.values())
        if isinstance(doc, str) and doc.startswith("no forky chroot"):
            print("SKIP:", doc)
            return SKIP
        if isinstance(doc, str):  # the chroot is there and transformers refused what we wrote: a failure
            print("FAIL:", doc)
            return 1
        versions = doc.pop("_versions")
        print("transformers %s, torch %s in the forky chroot" % (versions["transformers"], versions["torch"]))
        answers = ours_logits(dump, [(os.path.join(zoo, m, "model.safetensors"), ids, None) for m in dirs])
        ours = {m: logits for m, (logits, _) in zip(dirs, answers)}
        for m, d in dirs.items():
            theirs = doc[d]
            logits = ours[m]
            diff = max(abs(a - b) for r, s in zip(logits, theirs["logits"]) for a, b in zip(r, s)) if logits else float("inf")
            cfg = json.load(open(os.path.join(d, "config.json")))
            read = theirs["config"]
            same = all(read.get(k) == cfg.get(k) for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
                                                           "sliding_window", "layer_types", "attn_logit_softcapping",
                                                           "final_logit_softcapping") if k in cfg)
            this = diff <= TOL and theirs["class"] == CLASSES[m] and same
            ok &= this
            print("  %-8s %-20s max |ours - transformers| = %.2e over %d positions (logits up to %.1f); %d tensors; config read back %s%s"
                  % (m, theirs["class"], diff, len(theirs["logits"]), max(abs(x) for r in theirs["logits"] for x in r),
                     len(theirs["shapes"]), "the same" if same else "DIFFERENT: %s" % read, "" if this else "  FAIL"))
        # A planted exporter bug must fail the comparison on exactly the grouped-query members.
        planted = transformers_answer("hf_load.py", "--plant", "kv-heads-interleaved", ",".join(map(str, ids)), *dirs.values())
        if isinstance(planted, str):
            print("FAIL:", planted)
            return 1
        planted.pop("_versions")

        def grouped(d):
            c = json.load(open(os.path.join(d, "config.json")))
            g = c.get("num_key_value_heads", c["num_attention_heads"])
            return 1 < g < c["num_attention_heads"]

        def differing(plant):
            out = []
            for m, d in dirs.items():
                a, b = ours[m], planted[d]["logits"]  # ours against the planted export's
                if not a or max(abs(x - y) for r, s in zip(a, b) for x, y in zip(r, s)) > TOL:
                    out.append(m)
            return out

        ok &= plants_caught({"kv-heads-interleaved": [m for m, d in dirs.items() if grouped(d)]}, differing)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
