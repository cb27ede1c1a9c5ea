#!/usr/bin/env python3
"""An independent Python implementation of SPEC 1-4 (the series' GPT, cached and uncached), used
by the interop tests: it writes checkpoints exactly as the series' trainer does (torch.save of
{"model": state_dict, "config": ..., "step": N}, tied head) and the logits and greedy ids the C++
library must reproduce. Run with Debian's python3-torch: series_reference.py OUT_DIR
"""
import json
import math
import os
import sys
import tempfile
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

CFG = {"vocab_size": 4096, "d_model": 256, "n_heads": 4, "n_layers": 6, "context": 256, "dropout": 0.1}


_ROPE = {}  # (head dim, device) -> (cos, sin) of positions 0.. (P, hd / 2), grown as asked


def rope_tables(hd, end, device):
    """cos and sin of position p times each frequency, for p < end: the same float32 products whether
    one position or many is computed, so a table read at [start, start + T) equals computing them there."""
    key = (hd, str(device))
    if key not in _ROPE or _ROPE[key][0].shape[0] < end:
        freqs = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd)
        angles = torch.arange(0, max(end, 1024), dtype=torch.float32, device=device)[:, None] * freqs
        _ROPE[key] = (angles.cos(), angles.sin())
    return _ROPE[key]


def rope_at(x, start):
    hd, T = x.shape[-1], x.shape[-2]
    cos, sin = rope_tables(hd, start + T, x.device)
    cos, sin = cos[start:start + T], sin[start:start + T]
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.context = c["n_heads"], c["context"]
        self.qkv = nn.Linear(c["d_model"], 3 * c["d_model"], bias=False)
        self.out = nn.Linear(c["d_model"], c["d_model"], bias=False)

    def forward(self, x, cache=None, start=0):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = rope_at(q, start), rope_at(k, start)
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k[:, :, -self.context:], v[:, :, -self.context:]
        att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if T > 1:
            S = k.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
            att = att.masked_fill(~mask, float("-inf"))
        y = att.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.norm1 = nn.LayerNorm(d)
        self.attn = Attention(c)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, cache=None, start=0):
        x = x + self.attn(self.norm1(x), cache, start)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.emb = nn.Embedding(c["vocab_size"], c["d_model"])
        self.blocks = nn.ModuleList([Block(c) for _ in range(c["n_layers"])])
        self.norm = nn.LayerNorm(c["d_model"])
        self.head = nn.Linear(c["d_model"], c["vocab_size"], bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx, caches=None, start=0):
        x = self.emb(idx)
        for i, b in enumerate(self.blocks):
            x = b(x, None if caches is None else caches[i], start)
        return self.head(self.norm(x))

    @torch.no_grad()
    def uncached(self, idx, n):
        for _ in range(n):
            logits = self(idx[:, -self.c["context"]:])[:, -1]
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], 1)
        return idx

    @torch.no_grad()
    def cached(self, idx, n):
        caches = [{} for _ in self.blocks]
        prompt = idx[:, -self.c["context"]:]
        logits = self(prompt, caches, 0)[:, -1]
        pos = prompt.shape[1]
        for _ in range(n):
            nxt = logits.argmax(-1, keepdim=True)
            idx = torch.cat([idx, nxt], 1)
            logits = self(nxt, caches, pos)[:, -1]
            pos += 1
        return idx


class Evil:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def main(out):
    # ctest runs the interop tests as separate processes side by side, and each writes these files
    # when expected.json is missing: everything goes into a private folder first (same file names,
    # so torch.save's archive folder is still "series", as in the series' files), then is renamed
    # into place, expected.json last. A reader never sees a half-written file.
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".writing-", dir=out)
    torch.manual_seed(1234)
    model = GPT(CFG).eval()
    with torch.no_grad():  # larger weights than the series' init, so greedy decoding varies
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.08 if p.dim() > 1 else 0.3)
    sd = model.state_dict()
    torch.save({"model": sd, "config": dict(CFG), "step": 1500}, os.path.join(work, "series.pt"))
    with open(os.path.join(work, "series.bin"), "wb") as f:  # raw float32 bytes, state-dict order
        for name, t in sd.items():
            f.write(t.contiguous().numpy().tobytes())
    names = list(sd.keys())
    half = OrderedDict((k, v.half()) for k, v in sd.items())
    half["head.weight"] = half["emb.weight"]
    torch.save({"model": half, "config": dict(CFG), "step": 7}, os.path.join(work, "series_f16.pt"))
    torch.save({"model": Evil(), "config": dict(CFG), "step": 0}, os.path.join(work, "evil.pt"))
    prompts = [[1, 2, 3], [100, 200, 300, 400, 5]]
    expected = {"names": names, "prompts": []}
    with torch.no_grad():
        for p in prompts:
            idx = torch.tensor([p])
            expected["prompts"].append({
                "ids": p,
                "last_logits": model(idx)[0, -1].tolist(),
                "uncached": model.uncached(idx, 300)[0].tolist(),
                "cached": model.cached(idx, 300)[0].tolist(),
            })
    with open(os.path.join(work, "expected.json"), "w") as f:
        json.dump(expected, f)
    for name in ["series.pt", "series.bin", "series_f16.pt", "evil.pt", "expected.json"]:
        os.replace(os.path.join(work, name), os.path.join(out, name))
    os.rmdir(work)


if __name__ == "__main__":
    main(sys.argv[1])
