#!/usr/bin/env python3
"""Hugging Face transformers under `tinygpt conform`: our model as transformers' own GPTNeoXForCausalLM,
decoded through transformers' own cache objects, over the conform protocol (docs/protocol.md, protocol 2).
Runs inside the forky chroot (ci/forky.sh), started by engines/transformers/run.sh.

  adapter.py --cache dynamic   DynamicCache: never trims (past the window it attends to every key)
  adapter.py --cache sliding   a DynamicCache of DynamicSlidingWindowLayer(context + 1) layers: SPEC 4's
                               semantics (attend to up to context + 1 keys, keep context)
  adapter.py --cache static    StaticCache sized for the whole sequence (no trimming either)

Each row is its own cache at batch 1 (one forward per row and step); `fork` deep-copies a row's cache,
`truncate` crops it (DynamicCache and StaticCache; a sliding window cannot give back what it dropped,
so truncate is not offered there), `extend` feeds a chunk in one forward, `save` is the row's cache
object serialized by torch.save (`restore` loads it into a new row). No context shift: transformers'
caches have no operation for one. The sampler is transformers' own logits processors (repetition
penalty, temperature, top-k, top-p) and torch.multinomial with the request's seed.
Planted faults for the tests, TINYGPT_ENGINE_FAULT=...: `window-256` (a sliding window of context keys,
one too few), `positions-restart` (each step's position_ids from the row's cache length modulo the window).
"""
import argparse
import base64
import copy
import io
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import (DynamicCache, GPTNeoXConfig, GPTNeoXForCausalLM, LogitsProcessorList,
                          RepetitionPenaltyLogitsProcessor, StaticCache, TemperatureLogitsWarper,
                          TopKLogitsWarper, TopPLogitsWarper)

FAULTS = set(filter(None, os.environ.get("TINYGPT_ENGINE_FAULT", "").split(",")))


def neox_state(ours, n_layers, n_heads, d):
    """Our state dict -> GPTNeoX's: the fused qkv regrouped per head ([q_h | k_h | v_h]), and the q and k
    rows of each head permuted from our interleaved RoPE pairs (2j, 2j+1) to rotate-half (j, j + hd/2)."""
    hd = d // n_heads
    perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])  # new j <- old 2j, new hd/2 + j <- old 2j + 1
    out = {"gpt_neox.embed_in.weight": ours["emb.weight"], "embed_out.weight": ours["emb.weight"],
           "gpt_neox.final_layer_norm.weight": ours["norm.weight"], "gpt_neox.final_layer_norm.bias": ours["norm.bias"]}
    for i in range(n_layers):
        p, q = "blocks.%d." % i, "gpt_neox.layers.%d." % i
        qkv = ours[p + "attn.qkv.weight"]  # (3d, d): [Q | K | V]
        Q, K, V = qkv[:d], qkv[d:2 * d], qkv[2 * d:]
        heads = []
        for h in range(n_heads):
            rows = slice(h * hd, (h + 1) * hd)
            heads += [Q[rows][perm], K[rows][perm], V[rows]]
        out[q + "attention.query_key_value.weight"] = torch.cat(heads, 0)
        out[q + "attention.dense.weight"] = ours[p + "attn.out.weight"]
        for a, b in (("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")):
            out[q + b + ".weight"], out[q + b + ".bias"] = ours[p + a + ".weight"], ours[p + a + ".bias"]
        for a, b in (("mlp.0", "mlp.dense_h_to_4h"), ("mlp.2", "mlp.dense_4h_to_h")):
            out[q + b + ".weight"], out[q + b + ".bias"] = ours[p + a + ".weight"], ours[p + a + ".bias"]
    return out


class Engine:
    def __init__(self, cache_kind):
        self.kind = cache_kind
        self.model = None
        self.rows = {}  # id -> {"cache", "pos"}
        self.next_id = 0

    def load(self, req):
        if req.get("format") != "safetensors":
            raise ValueError("this engine loads format safetensors only")
        c = req["config"]
        self.context = int(c["context"])
        self.config = GPTNeoXConfig(vocab_size=c["vocab_size"], hidden_size=c["d_model"], num_hidden_layers=c["n_layers"],
                                    num_attention_heads=c["n_heads"], intermediate_size=4 * c["d_model"], hidden_act="gelu",
                                    rotary_pct=1.0, rotary_emb_base=10000, layer_norm_eps=1e-5,
                                    max_position_embeddings=4096, tie_word_embeddings=True, use_parallel_residual=False,
                                    attention_bias=False)
        model = GPTNeoXForCausalLM(self.config).eval()
        state = neox_state(load_file(req["checkpoint"]), c["n_layers"], c["n_heads"], c["d_model"])
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq") and "masked_bias" not in m and m != "embed_out.weight"]
        if missing or unexpected:
            raise ValueError("weights do not map: missing %s, unexpected %s" % (missing[:4], unexpected[:4]))
        model.set_attn_implementation("eager")
        self.model = model
        self.reset()

    def reset(self):
        self.rows, self.next_id = {}, 0

    def new_cache(self):
        if self.kind == "dynamic":
            return DynamicCache()
        if self.kind == "static":
            return StaticCache(config=self.config, max_cache_len=1024)
        from transformers.cache_utils import DynamicSlidingWindowLayer
        window = self.context if "window-256" in FAULTS else self.context + 1
        cache = DynamicCache()
        cache.layers = [DynamicSlidingWindowLayer(sliding_window=window) for _ in range(self.config.num_hidden_layers)]
        return cache

    @torch.no_grad()
    def feed(self, row, ids):
        """ids (T) at the row's next positions through its cache -> (V) logits of the last."""
        n = len(ids)
        pos = torch.arange(row["pos"], row["pos"] + n).unsqueeze(0)
        if "positions-restart" in FAULTS and n == 1:
            pos = pos % self.context
        out = self.model(input_ids=torch.tensor([ids]), position_ids=pos, past_key_values=row["cache"], use_cache=True,
                         cache_position=torch.arange(row["pos"], row["pos"] + n) if self.kind == "static" else None)
        row["cache"] = out.past_key_values
        row["pos"] += n
        return out.logits[0, -1].float()

    def add_rows(self, prompts):
        made, logits = [], []
        for ids in prompts:
            ids = [int(i) for i in ids][-self.context:]
            row = {"cache": self.new_cache(), "pos": 0}
            logits.append(self.feed(row, ids).tolist())
            self.rows[self.next_id] = row
            made.append(self.next_id)
            self.next_id += 1
        return logits, made

    def step_rows(self, rows, ids):
        return [self.feed(self.rows[r], [int(i)]).tolist() for r, i in zip(rows, ids)]

    def fork(self, rid):
        self.rows[self.next_id] = copy.deepcopy(self.rows[rid])
        self.next_id += 1
        return self.next_id - 1

    def extend(self, rid, ids):
        if rid not in self.rows or not ids:
            raise ValueError("row %r is not live, or no ids" % rid)
        return self.feed(self.rows[rid], [int(i) for i in ids]).tolist()

    def save(self, rid):
        buf = io.BytesIO()
        torch.save(self.rows[rid], buf)  # the row's cache object and position, as transformers keeps them
        return base64.b64encode(buf.getvalue()).decode()

    def restore(self, state):
        row = torch.load(io.BytesIO(base64.b64decode(state)), weights_only=False)  # our own save's bytes
        self.rows[self.next_id] = row
        self.next_id += 1
        return self.next_id - 1

    def truncate(self, rid, n):
        row = self.rows[rid]
        if self.kind == "sliding" or n < 0 or n > row["pos"]:
            raise ValueError("truncate: not offered for this cache or n out of range")
        row["cache"].crop(row["pos"] - n)
        row["pos"] -= n


def sample(req):
    """transformers' own processors in the suite's order: repetition penalty, temperature, top-k, top-p."""
    x = torch.tensor([[float(v) for v in row] for row in req["logits"]], dtype=torch.float32)  # (B, V)
    B, V = x.shape
    hist = req.get("history") or [[] for _ in range(B)]
    t, k, p, r, n = float(req["temperature"]), int(req["top_k"]), float(req["top_p"]), float(req["penalty"]), int(req["n"])
    if t == 0:
        if r != 1.0:
            x = torch.stack([RepetitionPenaltyLogitsProcessor(r)(torch.tensor([h or [0]]), x[b:b + 1])[0] if h else x[b]
                             for b, h in enumerate(hist)])
        return x.argmax(-1, keepdim=True).repeat(1, n).tolist()
    procs = LogitsProcessorList()
    if r != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(r))
    procs.append(TemperatureLogitsWarper(t))
    if 0 < k < V:
        procs.append(TopKLogitsWarper(k))
    if p < 1.0:
        procs.append(TopPLogitsWarper(p))
    rows = []
    for b in range(B):
        h = torch.tensor([hist[b]], dtype=torch.long) if hist[b] else torch.zeros((1, 0), dtype=torch.long)
        y = x[b:b + 1]
        for proc in procs:  # the penalty reads the history; an empty one leaves the scores alone
            if isinstance(proc, RepetitionPenaltyLogitsProcessor) and h.numel() == 0:
                continue
            y = proc(h, y)
        rows.append(y[0])
    g = torch.Generator().manual_seed(int(req["seed"]))
    return torch.multinomial(torch.stack(rows).softmax(-1), n, replacement=True, generator=g).tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", choices=("dynamic", "sliding", "static"), default="sliding")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = Engine(args.cache)
    ops = ["ragged", "join", "fork", "release", "threads"] + ([] if args.cache == "sliding" else ["truncate"])
    ops3 = ops + ["extend", "save", "restore"]
    spoken = 1
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        if op == "quit":
            return
        try:
            if op == "hello":
                name = "transformers %s (%s)" % (transformers.__version__, {"dynamic": "DynamicCache", "static": "StaticCache",
                                                                          "sliding": "DynamicSlidingWindowLayer"}[args.cache])
                if FAULTS:
                    name += " [%s]" % ",".join(sorted(FAULTS))
                out = {"ok": True, "name": name, "formats": ["safetensors"], "sampler": True}
                spoken = min(3, int(req.get("protocol", 1)))
                if spoken >= 2:
                    out["protocol"] = spoken
                    out["operations"] = ops3 if spoken >= 3 else ops
            elif op == "load":
                engine.load(req)
                out = {"ok": True}
            elif op == "reset":
                engine.reset()
                out = {"ok": True}
            elif op == "prefill":
                logits, made = engine.add_rows(req["ids"])
                out = {"ok": True, "logits": logits, "rows": made}
            elif op == "step":
                rows = req.get("rows", sorted(engine.rows))
                out = {"ok": True, "logits": engine.step_rows(rows, [i[0] if isinstance(i, list) else i for i in req["ids"]])}
            elif op == "fork":
                out = {"ok": True, "row": engine.fork(req["row"])}
            elif op == "extend" and spoken >= 3:
                out = {"ok": True, "logits": [engine.extend(req["row"], req["ids"])]}
            elif op == "save" and spoken >= 3:
                out = {"ok": True, "state": engine.save(req["row"])}
            elif op == "restore" and spoken >= 3:
                out = {"ok": True, "row": engine.restore(req["state"])}
            elif op == "truncate" and "truncate" in ops:
                engine.truncate(req["row"], req["n"])
                out = {"ok": True}
            elif op == "release":
                engine.rows.pop(req["row"], None)
                out = {"ok": True}
            elif op == "threads":
                out = {"ok": True, "before": torch.get_num_threads()}
                torch.set_num_threads(int(req["n"]))
            elif op == "sample":
                out = {"ok": True, "ids": sample(req)}
            else:
                out = {"ok": False, "error": "unknown op %r" % op}
        except Exception as e:  # reported against the request that caused it
            out = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
