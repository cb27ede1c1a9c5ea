"""transformers' own RoPE frequencies for a list of specs (run inside the forky chroot by
rope_scaling_vs_transformers.py): each spec through the rotary module of the model class that
uses it - LlamaRotaryEmbedding for full rotation, GPTNeoXRotaryEmbedding for partial - reading the
module's inv_freq buffer and attention_scaling, what the model multiplies positions and cos/sin by.
  python3 hf_rope.py SPECS_JSON   -> JSON list on stdout
"""
import json
import sys

import torch
import transformers
from transformers import GPTNeoXConfig, LlamaConfig
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply

# The rotation is checked on x (1, 2, T, hd) at these positions (inside the window, at its edge, far
# past it), x[i] = ((i * 7919) % 2003) / 1000 - 1 over its flat index: rope_dump builds the same.
POSITIONS = [0, 1, 2, 17, 63, 64, 65, 255, 256, 257, 511, 1000, 4095]


def probe(hd):
    n = 2 * len(POSITIONS) * hd
    return torch.tensor([((i * 7919) % 2003) / 1000.0 - 1.0 for i in range(n)], dtype=torch.float32).view(1, 2, len(POSITIONS), hd)


def rope_parameters(spec):
    c = spec.get("scaling", {})
    kind = c.get("kind", "none")
    p = {"rope_type": "default" if kind == "none" else kind, "rope_theta": float(spec.get("theta", 10000.0))}
    if kind != "none":
        p["factor"] = float(c["factor"])
    if kind == "llama3":
        p.update(low_freq_factor=float(c.get("low_freq_factor", 1.0)), high_freq_factor=float(c.get("high_freq_factor", 4.0)),
                 original_max_position_embeddings=int(c["original_context"]))
    if kind == "yarn":
        p.update(original_max_position_embeddings=int(c["original_context"]), beta_fast=float(c.get("beta_fast", 32.0)),
                 beta_slow=float(c.get("beta_slow", 1.0)), truncate=bool(c.get("truncate", True)))
        if "attention_factor" in c:
            p["attention_factor"] = float(c["attention_factor"])
    if float(spec.get("partial_rotary", 1.0)) != 1.0:
        p["partial_rotary_factor"] = float(spec["partial_rotary"])
    return p


def one(spec):
    hd = int(spec.get("head_dim", 64))
    heads = 2
    common = dict(hidden_size=hd * heads, num_attention_heads=heads, num_hidden_layers=1, intermediate_size=4 * hd,
                  vocab_size=32, max_position_embeddings=256, rope_parameters=rope_parameters(spec))
    if float(spec.get("partial_rotary", 1.0)) != 1.0:
        module, apply = GPTNeoXRotaryEmbedding(GPTNeoXConfig(**common)), neox_apply
    else:
        module, apply = LlamaRotaryEmbedding(LlamaConfig(head_dim=hd, **common)), llama_apply
    x = probe(hd)
    cos, sin = module(x, torch.tensor([POSITIONS], dtype=torch.int64))
    rotated, _ = apply(x, x, cos, sin)
    return {"name": spec["name"], "inv_freq": [float(v) for v in module.inv_freq.float().tolist()],
            "attention_factor": float(module.attention_scaling), "rotated": [float(v) for v in rotated.flatten().tolist()]}


def main():
    specs = json.loads(sys.argv[1])
    out = []
    for s in specs:
        try:
            out.append(one(s))
        except Exception as e:  # a spec transformers refuses
            out.append({"name": s["name"], "error": "%s: %s" % (type(e).__name__, e)})
    print(json.dumps({"transformers": transformers.__version__, "rows": out}))


if __name__ == "__main__":
    main()
