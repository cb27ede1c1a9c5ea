"""Runs in the forky chroot (qk_norm_observable.py starts it): writes two Qwen3 directories as a user's fresh
model comes out of transformers - random initial weights, tied embeddings, saved in bfloat16 by
save_pretrained, with a byte-level tokenizer.json of its 256 ids - into OUT/equal (every weight as transformers initialises it: the QK-norm weights all ones)
and OUT/unequal (the same model with its QK-norm weights drawn around 1). Prints, as its last line, JSON
{NAME: {"ids": [...], "greedy": [...]}}: transformers' own greedy ids from a fixed prompt (float32 over the
bfloat16 weights)."""
import json
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM

OUT = sys.argv[1]
cfg = AutoConfig.for_model("qwen3", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                           tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
torch.manual_seed(20261207)
gen = torch.Generator().manual_seed(20261207)
ids = torch.randint(0, 256, (1, 8), generator=gen)
answer = {"_versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
for name in ("equal", "unequal"):
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        if name == "unequal":
            for pname, p in model.named_parameters():
                if "q_norm" in pname or "k_norm" in pname:
                    p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
        for p in model.parameters():  # what the bfloat16 file holds, computed in float32
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
        out = model.generate(ids, max_new_tokens=40, do_sample=False)
    model.to(torch.bfloat16).save_pretrained(OUT + "/" + name)
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(OUT + "/" + name + "/tokenizer.json")
    answer[name] = {"ids": ids[0].tolist(), "greedy": out[0, ids.shape[1]:].tolist(),
                    "qk_norm_equal": bool(all(torch.equal(m.q_norm.weight, torch.ones_like(m.q_norm.weight))
                                              for m in (layer.self_attn for layer in model.model.layers)))}
print(json.dumps(answer))
