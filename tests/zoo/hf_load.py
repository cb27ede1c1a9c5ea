"""Runs in the forky chroot (zoo_export_vs_transformers.py starts it): loads each Hugging Face directory
named on the command line with transformers' own AutoModelForCausalLM (eager attention, float32) and
prints, as its last line, JSON {DIR: {"class", "config": {the hyper-parameters transformers read},
"shapes": {tensor: shape}, "logits": [[...], ...]}} for the ids given.
  hf_load.py [--plant kv-heads-interleaved] ID,ID,... DIR [DIR ...]
--plant makes each model what an exporter that wrote the query heads grouped by h % G instead of h / (H / G)
would give (SGLang PR #19086's shape, the output projection's columns moved with them): a grouped-query
model reads other KV heads; with one KV head, or one per query head, nothing changes."""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

args = sys.argv[1:]
plant = None
if args[0] == "--plant":
    plant, args = args[1], args[2:]
ids = torch.tensor([[int(i) for i in args[0].split(",")]])


def interleave_heads(model):
    c = model.config
    H, G = c.num_attention_heads, getattr(c, "num_key_value_heads", c.num_attention_heads)
    hd = getattr(c, "head_dim", None) or c.hidden_size // H
    order = [(h % G) * (H // G) + h // G for h in range(H)]  # the head written at h
    rows = torch.cat([torch.arange(o * hd, (o + 1) * hd) for o in order])
    for layer in getattr(model, "model", None).layers if hasattr(model, "model") else []:
        a = layer.self_attn
        with torch.no_grad():
            a.q_proj.weight.copy_(a.q_proj.weight[rows])
            a.o_proj.weight.copy_(a.o_proj.weight[:, rows])
            if getattr(a, "q_norm", None) is not None:
                pass  # per-head norms share one weight across heads: unchanged



answer = {"_versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
for d in args[1:]:
    model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
    if plant == "kv-heads-interleaved":
        interleave_heads(model)
    elif plant:
        sys.exit("hf_load.py: unknown plant %r" % plant)
    c = model.config
    keys = ["num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers", "hidden_size", "intermediate_size",
            "sliding_window", "layer_types", "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
            "use_parallel_residual", "tie_word_embeddings", "rope_parameters"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    answer[d] = {"class": type(model).__name__,
                 "config": {k: getattr(c, k) for k in keys if hasattr(c, k)},
                 "shapes": {n: list(p.shape) for n, p in model.state_dict().items()},
                 "logits": logits.tolist()}
print(json.dumps(answer, default=str))
