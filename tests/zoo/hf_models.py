"""Runs in the forky chroot (hf_vs_transformers.py starts it): writes a randomly initialised model of
each class SPEC 10's knobs cover into OUT/NAME (config.json + model.safetensors, as save_pretrained
writes them) and prints, as its last line, JSON {NAME: {"ids": [...], "logits": [[...], ...]}}: its
own forward's logits (eager attention, float32) for a fixed prompt.

Odd shapes on purpose: head_dim 48 that is not hidden / heads, 3 KV heads for 6 query heads, 5 layers,
a sliding window of 8 and RoPE scalings whose original context (16) is below the prompt's 40 tokens, so
every knob acts inside the prompt. Every weight is drawn away from its initialisation (norm weights
too), so a norm or a bias read wrong shows."""
import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

OUT = sys.argv[1]
COMMON = dict(vocab_size=100, hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=48,
              num_hidden_layers=5, intermediate_size=80, max_position_embeddings=64, tie_word_embeddings=False)
MODELS = {
    "llama": ("llama", dict(COMMON, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 16})),
    "mistral": ("mistral", dict(COMMON, sliding_window=8)),
    "qwen3": ("qwen3", dict(COMMON, rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                                     "original_max_position_embeddings": 16})),
    "gemma2": ("gemma2", dict(COMMON, tie_word_embeddings=True, sliding_window=8, query_pre_attn_scalar=40,
                              attn_logit_softcapping=8.0, final_logit_softcapping=4.0,
                              layer_types=["sliding_attention", "full_attention"] * 2 + ["sliding_attention"])),
    "neox": ("gpt_neox", dict(vocab_size=100, hidden_size=288, num_attention_heads=6, num_hidden_layers=5,
                              intermediate_size=80, max_position_embeddings=64, tie_word_embeddings=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
}

answer = {}
gen = torch.Generator().manual_seed(20261204)
ids = torch.randint(0, 100, (1, 40), generator=gen)
for name, (model_type, kw) in MODELS.items():
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(len(name))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:  # Gemma stores (1 + w)'s w: draw around 0 there, around 1 elsewhere
                p.copy_((0.0 if model_type == "gemma2" else 1.0) + 0.2 * torch.randn(p.shape, generator=gen))
            elif pname.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed" in pname:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        logits = model(ids).logits[0].float()
    model.save_pretrained(OUT + "/" + name)
    answer[name] = {"ids": ids[0].tolist(), "logits": logits.tolist(), "class": type(model).__name__}
    if name == "llama":  # as large directories come: bfloat16 weights in shards, computed in float32
        with torch.no_grad():  # the weights rounded, not the RoPE frequencies (a buffer, computed at load)
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
            logits = model(ids).logits[0].float()
        model.to(torch.bfloat16).save_pretrained(OUT + "/llama-bf16-sharded", max_shard_size="200KB")
        answer["llama-bf16-sharded"] = {"ids": ids[0].tolist(), "logits": logits.tolist(), "class": type(model).__name__}
answer["_versions"] = {"transformers": transformers.__version__, "torch": torch.__version__}
print(json.dumps(answer))
