#!/usr/bin/env python3
"""Writes Hugging Face tokenizers (tokenizer.json) of the two families directories hold, and what the
tokenizers library itself answers for a corpus of tricky strings, for tests/tokenizer/hf_tokenizers.sh to
hold our reader (lib/src/hf_tokenizer.cpp) against. Runs where the library is (forky's
python3-tokenizers, inside the chroot ci/forky.sh makes).

Usage: hf_cases.py OUT_DIR [NAME=TOKENIZER_JSON ...]
Each NAME=TOKENIZER_JSON adds a tokenizer.json written elsewhere (our export of the series' tokenizer),
read here by the library as it is. Writes OUT_DIR/NAME/tokenizer.json for each tokenizer and OUT_DIR/cases.json: {"library": version,
"tokenizers": [NAME...], "cases": [{"tokenizer", "text", "ids"} | {"tokenizer", "decode", "text"}]}.

The tokenizers, each trained here on this repository's docs (so merges are real, not hand-picked):
  byte-level     GPT-2's: ByteLevel pre-tokenizer (its own regex), ByteLevel decoder, <|endoftext|>
  llama3         Llama 3's / Qwen's: NFC, a Split on Llama 3's regex then ByteLevel without its regex,
                 a template adding <|begin_of_text|>, merges written as "a b" strings (the older format)
  byte-fallback  Llama 2's / Mistral's: Prepend and Replace normalizers, no pre-tokenizer, BPE with
                 byte_fallback and a fused <unk>, Replace/ByteFallback/Fuse/Strip decoder, <s> template
  metaspace      newer Llama / Mistral: a Metaspace pre-tokenizer (prepend first, split) and decoder,
                 an <unk> for what the vocabulary lacks
"""
import glob
import json
import os
import random
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TRICKY = [
    "", " ", "   ", "Hello world", "  leading spaces", "trailing   ", "tabs\tand\nnewlines\n\n", "\r\n windows line",
    "numbers 1234567 3.14159 2026-12-06", "it's they're we'll I'm you've he'd IT'S", "Ünïcödé café naïve",
    "日本語のテキストです", "emoji 🙂👍🏽 and 🇩🇪", "no\u00a0break\u2009thin", "e\u0301 combining (NFC makes it one)",
    "Ⅻ ﬁ ① compatibility", "<|endoftext|>", "text<|endoftext|>more <|endoftext|> end", "<s>glued</s>",
    "a" * 60, "words words words words", "z̷̢a̸l̷g̵o̶ text", "مرحبا بالعالم", "русский текст, ёж", "def f(x):\n    return x**2  # comment",
    "    indented\n\tcode", "!!!???...", "ALLCAPS and MiXeD", "\u200bzero\u200bwidth", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "x" + " " * 7 + "y",
    "<|begin_of_text|>already there", "\x00\x01 control \x7f", "你好，世界！", "한국어 텍스트",
]
POOL = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n.,;:!?'\"()-_") + list("éüßñøçÅ日本語中文ёжשλ€🙂́") + ["  ", "\r\n"]


def corpus():
    lines = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))[:6]:
        with open(path, encoding="utf-8") as f:
            lines += [l for l in f.read().splitlines() if l.strip()]
    return lines + TRICKY[3:20]


def byte_level(lines):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1200, special_tokens=["<|endoftext|>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    return t.to_str()


def llama3(lines):
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    doc = json.loads(t.to_str())
    doc["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in doc["model"]["merges"]]  # the older "a b" form
    return json.dumps(doc, ensure_ascii=False)


def byte_fallback(lines):
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1200, special_tokens=specials, limit_alphabet=70, show_progress=False))
    doc = json.loads(t.to_str())
    for a in doc["added_tokens"]:  # the byte tokens are vocabulary entries in such files, not added tokens
        if a["content"].startswith("<0x"):
            a["special"] = False
    doc["added_tokens"] = [a for a in doc["added_tokens"] if not a["content"].startswith("<0x")]
    t = Tokenizer.from_str(json.dumps(doc))
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
    return t.to_str()


def metaspace(lines):
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=80,
                                                     show_progress=False))
    return t.to_str()


def main(out, extra):
    os.makedirs(out, exist_ok=True)
    lines = corpus()
    rng = random.Random(20261206)
    texts = TRICKY + ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 40))) for _ in range(150)]
    made = {"byte-level": byte_level, "llama3": llama3, "byte-fallback": byte_fallback, "metaspace": metaspace}
    for item in extra:
        name, path = item.split("=", 1)
        made[name] = (lambda p: lambda _lines: open(p, encoding="utf-8").read())(path)
    cases = []
    for name, make in made.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        path = os.path.join(out, name, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(make(lines))
        t = Tokenizer.from_file(path)  # what the file says, read back by the library
        vocab = t.get_vocab_size(with_added_tokens=True)
        for s in texts:
            ids = t.encode(s).ids
            cases.append({"tokenizer": name, "text": s, "ids": ids})
            cases.append({"tokenizer": name, "decode": ids, "text": t.decode(ids)})
        for _ in range(60):  # ids in any order: pieces of characters, special ids, byte tokens alone
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
            cases.append({"tokenizer": name, "decode": ids, "text": t.decode(ids)})
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"library": tokenizers.__version__, "tokenizers": list(made), "cases": cases}, f, ensure_ascii=False)
    print("hf_cases: %d cases for %d tokenizers (tokenizers %s) in %s" % (len(cases), len(made), tokenizers.__version__, out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
