"""Runs in the forky chroot (ci/hf-size.sh starts it): writes a randomly initialised Hugging Face directory
shaped like a small model users run, as transformers' save_pretrained writes it, and its own greedy ids.

Usage: hf_size_model.py SHAPE OUT_DIR TOKENIZER_JSON PROMPT_IDS_JSON STEPS
SHAPE: smollm2-135m (LlamaForCausalLM: 30 layers, hidden 576, 9 query / 3 KV heads of 64, MLP 1536,
vocabulary 49,152, tied head, RoPE theta 100,000) or qwen3-0.6b (Qwen3ForCausalLM: 28 layers, hidden
1024, 16 / 8 heads of 128, QK-norm, MLP 3072, vocabulary 151,936, tied head, theta 1,000,000).
The context is cut to 1,024 (the published ones are 8,192 and 40,960): the rows' past-window runs then
cost what a run past a real window costs, not eight or forty times the window.

Writes OUT_DIR/config.json, model.safetensors (float32, as the weights are drawn: no rounding to
compare against), generation_config.json, tokenizer.json (copied) and OUT_DIR/transformers.json:
{"prompt": [...], "greedy": [...], "logits_first": [...], "seconds": ...}, transformers' own greedy
continuation (eager attention, float32, its DynamicCache) and the first step's logits."""
import json
import shutil
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

SHAPES = {
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                                   bos_token_id=1, eos_token_id=2)),
    "qwen3-0.6b": ("qwen3", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                 bos_token_id=151643, eos_token_id=151645)),
}
CONTEXT = 1024


def main(shape, out, tokenizer, prompt_path, steps):
    model_type, kw = SHAPES[shape]
    cfg = AutoConfig.for_model(model_type, max_position_embeddings=CONTEXT, **kw)
    torch.manual_seed(20261206)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    # At the initialiser's scale greedy repeats one or two ids for ever (a model that says nothing); with the
    # projections at 2/sqrt(fan-in) and unit embeddings every step picks another id, logits' spread ~24.
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(2 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=kw["bos_token_id"], eos_token_id=[kw["eos_token_id"]], do_sample=False).save_pretrained(out)
    shutil.copy(tokenizer, out + "/tokenizer.json")
    with open(prompt_path) as f:
        prompt = json.load(f)
    ids = torch.tensor([prompt])
    t0 = time.time()
    with torch.no_grad():
        first = model(ids).logits[0, -1].float()
        # Greedy with no stop: the run goes on through the eos id, as our rows' runs do.
        seq = model.generate(ids, max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
    answer = {"prompt": prompt, "greedy": seq[0, len(prompt):].tolist(), "logits_first": first.tolist(),
              "seconds": time.time() - t0, "class": type(model).__name__,
              "parameters": sum(p.numel() for p in model.parameters())}
    with open(out + "/transformers.json", "w") as f:
        json.dump(answer, f)
    print("%s: %s, %.1fM parameters, %d greedy steps in %.1f s" % (shape, answer["class"], answer["parameters"] / 1e6, steps,
                                                                 answer["seconds"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
