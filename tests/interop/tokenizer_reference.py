#!/usr/bin/env python3
"""Independent Python implementation of the series' tokenizer (SPEC 8) with the `regex` module:
tokenizer_reference.py TOKENIZER_JSON CASES_JSON -> prints {"ids": [...], "decoded": [...]}.
CASES_JSON: {"texts": [str], "byte_seqs": [[int]]}."""
import json
import sys

import regex

SPLIT = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def encode(text, ranks):
    out = []
    for chunk in SPLIT.findall(text):
        ids = list(chunk.encode("utf-8"))
        while len(ids) > 1:
            pairs = [(ranks[p], p) for p in zip(ids, ids[1:]) if p in ranks]
            if not pairs:
                break
            rank, (a, b) = min(pairs)
            merged, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and ids[i] == a and ids[i + 1] == b:
                    merged.append(256 + rank)
                    i += 2
                else:
                    merged.append(ids[i])
                    i += 1
            ids = merged
        out.extend(ids)
    return out


def main():
    merges = json.load(open(sys.argv[1]))["merges"]
    ranks = {(a, b): i for i, (a, b) in enumerate(merges)}
    cases = json.load(open(sys.argv[2]))
    print(json.dumps({
        "ids": [encode(t, ranks) for t in cases["texts"]],
        "decoded": [bytes(b).decode("utf-8", "replace") for b in cases["byte_seqs"]],
    }))


main()
