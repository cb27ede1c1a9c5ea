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
A zoo member (SPEC 10) comes as our .safetensors with its config, RoPE inverse frequencies and attention
factor in the metadata (tinygpt writes them): the same inputs and outputs, past K/V (B, G, S, hd) with
G its KV heads and hd its head size, and every knob of its config in the graph (ZooStep). Planted for the
suite's tests (TINYGPT_ENGINE_FAULT, which the adapter's conform run passes down): final-softcap-dropped,
a graph exported without the final soft-cap.

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


def read_safetensors(path):
    """Our .safetensors checkpoint without the safetensors package (Debian bookworm has none): the header's
    JSON, then each tensor's bytes. Returns (state dict, metadata)."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    sd = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        sd[name] = torch.frombuffer(bytearray(data[a:b]), dtype=dtypes[t["dtype"]]).reshape(t["shape"]).to(torch.float32)
    return sd, header.get("__metadata__", {})


class ZooStep(nn.Module):
    """A zoo member (SPEC 10) as one graph, the knobs of its config: grouped-query attention, RMSNorm (and
    Gemma's 1 + w), sandwich norms, parallel residual, gated MLPs, biases, QK-norm, RoPE over halves or
    adjacent pairs of a rotated fraction with the member's own frequencies and attention factor (computed
    by tinygpt and passed in the checkpoint's metadata), soft-caps, the query scale, the embedding scale,
    and a band of w keys on sliding layers. Inputs and outputs as Step's; past K/V are (B, G, S, hd)."""

    def __init__(self, sd, cfg, inv_freq, attention_factor):
        super().__init__()
        self.c = cfg
        for k, v in sd.items():
            self.register_buffer(k.replace(".", "_"), v.clone())
        self.register_buffer("inv_freq", torch.tensor(inv_freq, dtype=torch.float32))
        self.af = attention_factor

    def p(self, name):
        return getattr(self, name.replace(".", "_"))

    def has(self, name):
        return hasattr(self, name.replace(".", "_"))

    def norm(self, x, name):
        c = self.c
        eps = c.get("norm_eps", 1e-5)
        if c.get("norm", "layernorm") == "layernorm":
            w = self.p(name + ".weight")
            return nn.functional.layer_norm(x, (int(w.shape[0]),), w, self.p(name + ".bias"), eps)
        w = self.p(name + ".weight")
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * (1.0 + w) if c["norm"] == "rmsnorm_plus_one" else y * w

    def act(self, x):
        a = self.c.get("activation", "gelu")
        if a == "silu":
            return nn.functional.silu(x)
        return nn.functional.gelu(x, approximate="tanh" if a == "gelu_tanh" else "none")

    def rope(self, x, start=None, positions=None):
        """x (B, heads, T, hd): the first `rotated` channels turned, in pairs of halves or adjacent, at
        positions start .. start + T - 1, or at positions (B, T)."""
        T, hd = x.shape[-2], x.shape[-1]
        r = 2 * self.inv_freq.shape[0]
        if positions is None:
            pos = (start + torch.arange(T, dtype=torch.int64)).to(torch.float32)
            ang = pos[:, None] * self.inv_freq[None, :]  # (T, r/2)
        else:
            ang = positions.to(torch.float32)[:, None, :, None] * self.inv_freq  # (B, 1, T, r/2)
        cos, sin = ang.cos() * self.af, ang.sin() * self.af
        xr, rest = x[..., :r], x[..., r:]
        if self.c.get("rope_pairing", "adjacent") == "halves":
            a, b = xr[..., : r // 2], xr[..., r // 2:]
            y = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        else:
            a, b = xr[..., 0::2], xr[..., 1::2]
            y = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
        return torch.cat([y, rest], dim=-1) if r < hd else y

    def forward(self, ids, start, *past):
        return self.run(ids, past, start=start)

    def run(self, ids, past, start=None, positions=None, all_logits=False):
        c = self.c
        d, H, L = c["d_model"], c["n_heads"], c["n_layers"]
        G = c.get("n_kv_heads") or H
        hd = c.get("head_size") or d // H
        types = c.get("layer_types") or ["full"] * L
        w = c.get("sliding_window", 0)
        scale = (c.get("query_pre_attn_scalar") or hd) ** -0.5
        B, T = ids.shape
        x = self.p("emb.weight")[ids]
        if c.get("embed_scale"):
            x = x * torch.tensor(d ** 0.5, dtype=torch.float32)
        presents = []
        for l in range(L):
            pre = "blocks.%d." % l
            h = self.norm(x, pre + "norm1")
            qkv = h @ self.p(pre + "attn.qkv.weight").t()
            if c.get("attn_bias"):
                qkv = qkv + self.p(pre + "attn.qkv.bias")
            q, k, v = qkv.split([H * hd, G * hd, G * hd], dim=-1)
            q = q.reshape(B, T, H, hd).transpose(1, 2)
            k = k.reshape(B, T, G, hd).transpose(1, 2)
            v = v.reshape(B, T, G, hd).transpose(1, 2)
            if c.get("qk_norm"):
                q, k = self.norm(q, pre + "attn.q_norm"), self.norm(k, pre + "attn.k_norm")
            q, k = self.rope(q, start, positions), self.rope(k, start, positions)
            K = torch.cat([past[2 * l], k], dim=2)
            V = torch.cat([past[2 * l + 1], v], dim=2)
            presents += [K, V]
            S = K.shape[2]
            Kh = K[:, :, None].expand(B, G, H // G, S, hd).reshape(B, H, S, hd)  # query head h reads KV head h / (H / G)
            Vh = V[:, :, None].expand(B, G, H // G, S, hd).reshape(B, H, S, hd)
            att = q @ Kh.transpose(-2, -1) * scale
            if c.get("attn_softcap"):
                att = torch.tanh(att / c["attn_softcap"]) * c["attn_softcap"]
            qi = S - T + torch.arange(T)[:, None]
            kj = torch.arange(S)[None, :]
            seen = kj <= qi  # bottom-right causal
            if types[l] == "sliding":
                seen = seen & (qi - kj < w)  # SPEC 10: query i sees keys i - w < j <= i
            att = att.masked_fill(~seen, float("-inf"))
            y = (att.softmax(-1) @ Vh).transpose(1, 2).reshape(B, T, H * hd) @ self.p(pre + "attn.out.weight").t()
            if c.get("attn_bias"):
                y = y + self.p(pre + "attn.out.bias")
            if c.get("sandwich_norms"):
                y = self.norm(y, pre + "post_attn_norm")
            mlp_in = x if c.get("parallel_residual") else x + y
            h = self.norm(mlp_in, pre + "norm2")
            if c.get("gated_mlp"):
                m = (self.act(h @ self.p(pre + "mlp.gate.weight").t()) * (h @ self.p(pre + "mlp.up.weight").t())) @ self.p(pre + "mlp.down.weight").t()
            else:
                bias = c.get("mlp_bias", True)
                u = h @ self.p(pre + "mlp.0.weight").t() + (self.p(pre + "mlp.0.bias") if bias else 0)
                m = self.act(u) @ self.p(pre + "mlp.2.weight").t() + (self.p(pre + "mlp.2.bias") if bias else 0)
            if c.get("sandwich_norms"):
                m = self.norm(m, pre + "post_mlp_norm")
            x = (x + y + m) if c.get("parallel_residual") else (mlp_in + m)
        x = self.norm(x if all_logits else x[:, -1], "norm")
        head = self.p("head.weight") if self.has("head.weight") else self.p("emb.weight")
        logits = x @ head.t()
        if c.get("final_softcap") and "final-softcap-dropped" not in os.environ.get("TINYGPT_ENGINE_FAULT", ""):
            logits = torch.tanh(logits / c["final_softcap"]) * c["final_softcap"]
        return (logits, *presents)


class HfZooStep(ZooStep):
    """The same member under the Hugging Face names transformers.js reads, positions per token, logits at
    every position."""

    def forward(self, input_ids, position_ids, *past):
        return self.run(input_ids, past, positions=position_ids, all_logits=True)


# The model_type transformers.js reads a member's cache shape by (num_key_value_heads, head_dim), as
# docs/zoo.md maps members to classes.
def hf_model_type(cfg):
    if cfg.get("norm") == "rmsnorm_plus_one":
        return "gemma2", "Gemma2ForCausalLM"
    if cfg.get("norm", "layernorm") == "layernorm":
        return "gpt_neox", "GPTNeoXForCausalLM"
    if cfg.get("qk_norm"):
        return "qwen3", "Qwen3ForCausalLM"
    types = cfg.get("layer_types") or []
    if types and all(t == "sliding" for t in types):
        return "mistral", "MistralForCausalLM"
    return "llama", "LlamaForCausalLM"


def export_zoo(src, out):
    sd, meta = read_safetensors(src)
    cfg = json.loads(meta["config"])
    step = ZooStep(sd, cfg, json.loads(meta["rope_inv_freq"]), float(meta["rope_attention_factor"])).eval()
    L, H = cfg["n_layers"], cfg["n_heads"]
    G = cfg.get("n_kv_heads") or H
    hd = cfg.get("head_size") or cfg["d_model"] // H
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int64)
    start = torch.tensor(0, dtype=torch.int64)
    past = [torch.zeros(1, G, 2, hd) for _ in range(2 * L)]
    export_step(step, (ids, start, *past), L, out, "zoo member, %d layers, %d KV heads" % (L, G))


def export_step(step, example, L, out, what):
    names_past = [n for l in range(L) for n in ("past_k_%d" % l, "past_v_%d" % l)]
    names_present = [n for l in range(L) for n in ("present_k_%d" % l, "present_v_%d" % l)]
    axes = {"ids": {0: "B", 1: "T"}, "logits": {0: "B"}}
    for n in names_past:
        axes[n] = {0: "B", 2: "S"}
    for n in names_present:
        axes[n] = {0: "B", 2: "S_T"}
    tmp = out + ".tmp.%d" % os.getpid()
    with torch.no_grad():
        torch.onnx.export(step, example, tmp, input_names=["ids", "start"] + names_past,
                          output_names=["logits"] + names_present, dynamic_axes=axes, opset_version=17)
    os.replace(tmp, out)
    print("export_onnx: wrote %s (%s, opset 17)" % (out, what))


def export_transformers_js(src, out):
    if src.endswith(".safetensors"):  # a zoo member: its own class's model_type, its KV heads and head size
        sd, meta = read_safetensors(src)
        cfg = json.loads(meta["config"])
        step = HfZooStep(sd, cfg, json.loads(meta["rope_inv_freq"]), float(meta["rope_attention_factor"])).eval()
        L, H = cfg["n_layers"], cfg["n_heads"]
        G, hd = cfg.get("n_kv_heads") or H, cfg.get("head_size") or cfg["d_model"] // H
        model_type, cls = hf_model_type(cfg)
    else:
        ck = torch.load(src, map_location="cpu")
        cfg, sd = ck["config"], ck["model"]
        step = HfStep(sd, cfg).eval()
        L, H, hd = cfg["n_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
        G, model_type, cls = H, "gpt_neox", "GPTNeoXForCausalLM"
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int64)
    positions = torch.tensor([[2, 3, 4]], dtype=torch.int64)
    past = [torch.zeros(1, G, 2, hd) for _ in range(2 * L)]
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
    config = {"model_type": model_type, "architectures": [cls], "vocab_size": cfg["vocab_size"],
              "hidden_size": cfg["d_model"], "num_attention_heads": H, "num_hidden_layers": L,
              "max_position_embeddings": cfg["context"], "use_cache": True}
    if model_type != "gpt_neox":
        config.update({"num_key_value_heads": G, "head_dim": hd})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.replace(tmp, out)
    print("export_onnx: wrote %s (transformers.js layout, %d layers, opset 17)" % (out, L))


def main(src, out):
    if src.endswith(".safetensors"):  # a zoo member: its config and RoPE frequencies in the metadata
        return export_zoo(src, out)
    ck = torch.load(src, map_location="cpu")
    cfg, sd = ck["config"], ck["model"]
    step = Step(sd, cfg).eval()
    L, H, hd = cfg["n_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int64)
    start = torch.tensor(0, dtype=torch.int64)
    past = [torch.zeros(1, H, 2, hd) for _ in range(2 * L)]
    export_step(step, (ids, start, *past), L, out, "%d layers" % L)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--transformers-js":
        export_transformers_js(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        sys.exit("usage: export_onnx.py CHECKPOINT.pt OUT.onnx | export_onnx.py --transformers-js CHECKPOINT.pt OUT_DIR")
