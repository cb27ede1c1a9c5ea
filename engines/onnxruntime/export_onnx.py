#!/usr/bin/env python3
"""Exports our model (a checkpoint as the series' torch.save writes it) to ONNX: one graph for
prefill and decode, so an ONNX runtime can run the cached path of SPEC 4 with the adapter supplying
positions. Needs only Debian's python3-torch (1.13 exports opset 17 without python3-onnx).

Inputs:  ids (B, T) int64; start () int64, the position of ids[:, 0];
         past_k_L, past_v_L (B, H, S, hd) float32 for each layer L, S >= 0 (S = 0 for a prefill).
Outputs: logits (B, V) float32, the last position's;
         present_k_L, present_v_L (B, H, S + T, hd): past and the new entries. The caller keeps the last
         `context` of them for the next call (SPEC 4: a decode step attends to up to context + 1 keys).
Query i (at position start + i) sees every past entry and the new ones up to itself; GELU is the exact
erf form. Usage: export_onnx.py CHECKPOINT.pt OUT.onnx

With --transformers-js, OUT is a folder laid out as transformers.js loads a causal LM from disk:
config.json (model_type gpt_neox, for its config normalisation and cache names) and onnx/model.onnx,
whose names are the Hugging Face ones: input_ids (B, T), position_ids (B, T), past_key_values.L.key /
.value (B, H, S, hd) in; logits (B, T, V) and present.L.key / .value out. Positions come per row and
token, so the caller - or transformers.js, from the attention mask - decides them.
Usage: export_onnx.py --transformers-js CHECKPOINT.pt OUT_DIR
"""
import json
import math
import os
import shutil
import sys

import torch
import torch.nn as nn


def rope(x, start=None, positions=None):
    """x (B, H, T, hd) rotated pairwise (2j, 2j+1) at positions start .. start + T - 1, or at
    positions (B, T) (SPEC 2)."""
    hd, T = x.shape[-1], x.shape[-2]
    freqs = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    if positions is None:
        pos = (start + torch.arange(T, dtype=torch.int64)).to(torch.float32)
        ang = pos[:, None] * freqs[None, :]  # (T, hd/2)
    else:
        ang = positions.to(torch.float32)[:, None, :, None] * freqs  # (B, 1, T, hd/2)
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


class Step(nn.Module):
    def __init__(self, sd, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = {k: v.clone() for k, v in sd.items()}
        for k, v in self.w.items():
            self.register_buffer(k.replace(".", "_"), v)

    def p(self, name):
        return getattr(self, name.replace(".", "_"))

    def forward(self, ids, start, *past):
        return self.run(ids, past, start=start)

    def run(self, ids, past, start=None, positions=None, all_logits=False):
        c = self.cfg
        L, H, d = c["n_layers"], c["n_heads"], c["d_model"]
        hd = d // H
        B, T = ids.shape
        x = self.p("emb.weight")[ids]
        presents = []
        for l in range(L):
            pre = "blocks.%d." % l
            h = nn.functional.layer_norm(x, (d,), self.p(pre + "norm1.weight"), self.p(pre + "norm1.bias"), 1e-5)
            q, k, v = (h @ self.p(pre + "attn.qkv.weight").t()).split(d, dim=-1)
            q, k, v = (t.reshape(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
            q, k = rope(q, start, positions), rope(k, start, positions)
            K = torch.cat([past[2 * l], k], dim=2)
            V = torch.cat([past[2 * l + 1], v], dim=2)
            presents += [K, V]
            S = K.shape[2]
            att = q @ K.transpose(-2, -1) / math.sqrt(hd)
            seen = torch.arange(S)[None, :] <= (S - T + torch.arange(T))[:, None]  # bottom-right causal
            att = att.masked_fill(~seen, float("-inf"))
            y = (att.softmax(-1) @ V).transpose(1, 2).reshape(B, T, d)
            x = x + y @ self.p(pre + "attn.out.weight").t()
            h = nn.functional.layer_norm(x, (d,), self.p(pre + "norm2.weight"), self.p(pre + "norm2.bias"), 1e-5)
            u = nn.functional.gelu(h @ self.p(pre + "mlp.0.weight").t() + self.p(pre + "mlp.0.bias"))  # exact erf
            x = x + u @ self.p(pre + "mlp.2.weight").t() + self.p(pre + "mlp.2.bias")
        x = nn.functional.layer_norm(x if all_logits else x[:, -1], (d,), self.p("norm.weight"), self.p("norm.bias"), 1e-5)
        return (x @ self.p("emb.weight").t(), *presents)


class HfStep(Step):
    """The same step under the Hugging Face names, positions per token, logits at every position."""

    def forward(self, input_ids, position_ids, *past):
        return self.run(input_ids, past, positions=position_ids, all_logits=True)


def export_transformers_js(src, out):
    ck = torch.load(src, map_location="cpu")
    cfg, sd = ck["config"], ck["model"]
    step = HfStep(sd, cfg).eval()
    L, H, hd = cfg["n_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int64)
    positions = torch.tensor([[2, 3, 4]], dtype=torch.int64)
    past = [torch.zeros(1, H, 2, hd) for _ in range(2 * L)]
    names_past = [n for l in range(L) for n in ("past_key_values.%d.key" % l, "past_key_values.%d.value" % l)]
    names_present = [n for l in range(L) for n in ("present.%d.key" % l, "present.%d.value" % l)]
    # transformers.js sizes an empty cache from these names: batch_size is the batch, the rest 0.
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "position_ids": {0: "batch_size", 1: "sequence_length"},
            "logits": {0: "batch_size", 1: "sequence_length"}}
    for n in names_past:
        axes[n] = {0: "batch_size", 2: "past_sequence_length"}
    for n in names_present:
        axes[n] = {0: "batch_size", 2: "total_sequence_length"}
    tmp = out + ".tmp.%d" % os.getpid()
    os.makedirs(os.path.join(tmp, "onnx"))
    with torch.no_grad():
        torch.onnx.export(step, (ids, positions, *past), os.path.join(tmp, "onnx", "model.onnx"),
                          input_names=["input_ids", "position_ids"] + names_past,
                          output_names=["logits"] + names_present, dynamic_axes=axes, opset_version=17)
    config = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": cfg["vocab_size"],
              "hidden_size": cfg["d_model"], "num_attention_heads": H, "num_hidden_layers": L,
              "max_position_embeddings": cfg["context"], "use_cache": True}
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.replace(tmp, out)
    print("export_onnx: wrote %s (transformers.js layout, %d layers, opset 17)" % (out, L))


def main(src, out):
    ck = torch.load(src, map_location="cpu")
    cfg, sd = ck["config"], ck["model"]
    step = Step(sd, cfg).eval()
    L, H, hd = cfg["n_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int64)
    start = torch.tensor(0, dtype=torch.int64)
    past = [torch.zeros(1, H, 2, hd) for _ in range(2 * L)]
    names_past = [n for l in range(L) for n in ("past_k_%d" % l, "past_v_%d" % l)]
    names_present = [n for l in range(L) for n in ("present_k_%d" % l, "present_v_%d" % l)]
    axes = {"ids": {0: "B", 1: "T"}, "logits": {0: "B"}}
    for n in names_past:
        axes[n] = {0: "B", 2: "S"}
    for n in names_present:
        axes[n] = {0: "B", 2: "S_T"}
    tmp = out + ".tmp.%d" % os.getpid()
    with torch.no_grad():
        torch.onnx.export(step, (ids, start, *past), tmp, input_names=["ids", "start"] + names_past,
                          output_names=["logits"] + names_present, dynamic_axes=axes, opset_version=17)
    os.replace(tmp, out)
    print("export_onnx: wrote %s (%d layers, opset 17)" % (out, L))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--transformers-js":
        export_transformers_js(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        sys.exit("usage: export_onnx.py CHECKPOINT.pt OUT.onnx | export_onnx.py --transformers-js CHECKPOINT.pt OUT_DIR")
