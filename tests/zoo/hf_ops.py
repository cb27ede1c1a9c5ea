"""transformers' own modules on the probes zoo_ops_dump uses (run inside the forky chroot by
zoo_ops_vs_transformers.py): LlamaRMSNorm, Gemma2RMSNorm, LlamaMLP (SiLU), Gemma2MLP (gelu_pytorch_tanh)
and Gemma 2's eager attention (repeat_kv, query_pre_attn_scalar's scale, the attention soft-cap).
  python3 hf_ops.py   -> JSON {case: [values...]} on stdout
"""
import json
import math

import torch
import transformers
from transformers import Gemma2Config, LlamaConfig
from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP, Gemma2RMSNorm, eager_attention_forward
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm


def probe(shape, seed):
    n = math.prod(shape)
    return torch.tensor([((i * 7919 + seed) % 2003) / 1000.0 - 1.0 for i in range(n)], dtype=torch.float32).view(*shape)


def causal(t, s):
    i, j = torch.arange(t).unsqueeze(1), torch.arange(s).unsqueeze(0)
    return torch.zeros(t, s).masked_fill(j > i + (s - t), float("-inf"))


class Stub(torch.nn.Module):  # what eager_attention_forward reads of its module
    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.head_dim = 16


@torch.no_grad()
def main():
    out = {}
    x = probe((2, 5, 48), 0)
    n = LlamaRMSNorm(48, eps=1e-6)
    n.weight.copy_(probe((48,), 1) * 0.5 + 1.0)
    out["rmsnorm"] = n(x).flatten().tolist()
    g = Gemma2RMSNorm(48, eps=1e-6)
    g.weight.copy_(probe((48,), 2) * 0.5)
    out["rmsnorm_plus_one"] = g(x).flatten().tolist()
    gate, up, down = probe((96, 48), 3) * 0.1, probe((96, 48), 4) * 0.1, probe((48, 96), 5) * 0.1
    for name, mlp in (("swiglu", LlamaMLP(LlamaConfig(hidden_size=48, intermediate_size=96, hidden_act="silu", num_attention_heads=3, num_key_value_heads=3))),
                      ("geglu", Gemma2MLP(Gemma2Config(hidden_size=48, intermediate_size=96, hidden_activation="gelu_pytorch_tanh", num_attention_heads=3, num_key_value_heads=3, head_dim=16)))):
        mlp.gate_proj.weight.copy_(gate)
        mlp.up_proj.weight.copy_(up)
        mlp.down_proj.weight.copy_(down)
        out[name] = mlp(x).flatten().tolist()
    q, k, v = probe((1, 6, 7, 16), 6) * 3.0, probe((1, 2, 9, 16), 7) * 3.0, probe((1, 2, 9, 16), 8)
    mask = causal(7, 9).view(1, 1, 7, 9)
    scale = 24 ** -0.5
    for name, kk, vv, cap in (("attention_gqa_softcap", k, v, 5.0), ("attention_gqa", k, v, None),
                              ("attention_mqa", k[:, :1], v[:, :1], None)):
        y, _ = eager_attention_forward(Stub(6 // kk.shape[1]).eval(), q, kk, vv, mask, dropout=0.0, scaling=scale, softcap=cap)
        out[name] = y.transpose(1, 2).flatten().tolist()  # eager returns (B, T, H, hd): back to (B, H, T, hd)
    print(json.dumps({"transformers": transformers.__version__, "cases": out}))


if __name__ == "__main__":
    main()
