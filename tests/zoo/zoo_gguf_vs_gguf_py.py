#!/usr/bin/env python3
"""`tinygpt export --format gguf` of every zoo member, read by llama.cpp's own Python reader (gguf-py,
Debian forky's python3-gguf, in the chroot): each file names the architecture the member maps to, only
tensor names that architecture knows, the shapes llama.cpp's loader asks for, and the hyper-parameters
of the member - those of the same member's Hugging Face export (`--format hf`, whose config.json
transformers reads back as the member: engine.ZooExportsLoadInTransformers), so two exports of one model
are checked against each other by two readers that are not ours.

  zoo_gguf_vs_gguf_py.py TINYGPT
Exit 0 when all hold; 1 otherwise; 77 when the forky chroot (ci/forky.sh) is not there."""
import json
import os
import subprocess
import sys
import tempfile

from zoo_common import ROOT, SKIP, transformers_answer

ARCH = {"llama": "llama", "mqa": "llama", "mistral": "llama", "gemma2": "gemma2", "qwen3": "qwen3", "neox": "gptneox"}


def expected(arch, hf):
    """GGUF key -> value, from the member's config.json."""
    a = arch + "."
    layers = hf["num_hidden_layers"]
    rp = hf.get("rope_parameters", {})
    want = {a + "block_count": layers, a + "embedding_length": hf["hidden_size"], a + "attention.head_count": hf["num_attention_heads"],
            a + "context_length": hf["max_position_embeddings"], a + "feed_forward_length": hf["intermediate_size"],
            a + "vocab_size": hf["vocab_size"]}
    hd = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if arch == "gptneox":
        want[a + "rope.dimension_count"] = int(hd * hf.get("rotary_pct", 1.0))
        want[a + "use_parallel_residual"] = hf["use_parallel_residual"]
        want[a + "attention.layer_norm_epsilon"] = hf["layer_norm_eps"]
    else:
        want.update({a + "attention.head_count_kv": hf["num_key_value_heads"], a + "attention.key_length": hd,
                     a + "attention.value_length": hd, a + "rope.dimension_count": hd, a + "attention.layer_norm_rms_epsilon": hf["rms_norm_eps"]})
        if hf.get("sliding_window"):
            want[a + "attention.sliding_window"] = hf["sliding_window"]
        for k in ("attn_logit_softcapping", "final_logit_softcapping"):
            if hf.get(k):
                want[a + k] = hf[k]
    want[a + "rope.freq_base"] = rp.get("rope_theta", 10000)
    if rp.get("rope_type") == "yarn":
        want.update({a + "rope.scaling.type": "yarn", a + "rope.scaling.factor": rp["factor"],
                     a + "rope.scaling.original_context_length": rp["original_max_position_embeddings"]})
    return want


def shapes(arch, hf):
    """Tensor name -> the ne llama.cpp's loader asks for (fastest dimension first), a sample per kind."""
    d, V, ff = hf["hidden_size"], hf["vocab_size"], hf["intermediate_size"]
    H = hf["num_attention_heads"]
    hd = hf.get("head_dim") or d // H
    G = hf.get("num_key_value_heads", H)
    s = {"token_embd.weight": [d, V], "output_norm.weight": [d], "blk.0.ffn_up.weight": [d, ff], "blk.0.ffn_down.weight": [ff, d]}
    if arch == "gptneox":
        s.update({"blk.0.attn_qkv.weight": [d, 3 * d], "blk.0.attn_qkv.bias": [3 * d], "output.weight": [d, V]})
    else:
        s.update({"blk.0.attn_q.weight": [d, H * hd], "blk.0.attn_k.weight": [d, G * hd], "blk.0.attn_v.weight": [d, G * hd],
                  "blk.0.attn_output.weight": [H * hd, d], "blk.0.ffn_gate.weight": [d, ff]})
    if arch == "qwen3":
        s["blk.0.attn_q_norm.weight"] = [hd]
    if arch == "gemma2":
        s["blk.0.post_ffw_norm.weight"] = [d]
    if rp_type(hf) == "llama3":
        s["rope_freqs.weight"] = [hd // 2]
    return s


def rp_type(hf):
    return hf.get("rope_parameters", {}).get("rope_type")


def main():
    tinygpt = sys.argv[1]
    zoo = os.path.join(ROOT, "golden", "zoo")
    members = [m for m in ARCH if os.path.isfile(os.path.join(zoo, m, "model.safetensors"))]
    ok = True
    with tempfile.TemporaryDirectory(prefix="tinygpt-gguf-export-") as work:
        files, configs = {}, {}
        for m in members:
            ck = os.path.join(zoo, m, "model.safetensors")
            files[m] = os.path.join(work, m + ".gguf")
            for fmt, out in (("gguf", files[m]), ("hf", os.path.join(work, m + "-hf"))):
                subprocess.run([tinygpt, "export", "--format", fmt, "--checkpoint", ck, out], check=True, capture_output=True)
            configs[m] = json.load(open(os.path.join(work, m + "-hf", "config.json")))
        doc = transformers_answer("gguf_fields.py", *files.values())
        if isinstance(doc, str) and doc.startswith("no forky chroot"):
            print("SKIP:", doc)
            return SKIP
        if isinstance(doc, str):
            print("FAIL: gguf-py could not read what we wrote:", doc)
            return 1
        print("gguf-py %s in the forky chroot" % doc.pop("_version"))
        def problems_of(got, m):
            arch = got["fields"]["general.architecture"]
            problems = []
            if arch != ARCH[m]:
                problems.append("architecture %s, not %s" % (arch, ARCH[m]))
            for k, v in expected(ARCH[m], configs[m]).items():
                g = got["fields"].get(k)
                if g is None or (abs(g - v) > 1e-6 * max(1, abs(v)) if isinstance(v, float) else g != v):
                    problems.append("%s = %r, the member's is %r" % (k, g, v))
            for k, v in shapes(ARCH[m], configs[m]).items():
                if got["tensors"].get(k) != v:
                    problems.append("%s has ne %s, llama.cpp asks for %s" % (k, got["tensors"].get(k), v))
            if got["unknown"]:
                problems.append("tensors %s unknown to %s" % (", ".join(got["unknown"]), arch))
            return arch, problems

        for m in members:
            got = doc[files[m]]
            arch, problems = problems_of(got, m)
            print("  %-8s %-8s %d fields, %d tensors: %s" % (m, arch, len(got["fields"]), len(got["tensors"]),
                                                          "as the member" if not problems else "; ".join(problems)))
            ok &= not problems
        # The comparison can fail: one member's file judged as another's must show the difference.
        if "llama" in members and "mqa" in members:
            _, crossed = problems_of(doc[files["llama"]], "mqa")
            print("  planted: llama's file judged as mqa's: %s" % ("%d differences, the first: %s" % (len(crossed), crossed[0])
                                                                   if crossed else "NO difference found"))
            ok &= bool(crossed)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
