#!/usr/bin/env python3
"""What gguf-py (llama.cpp's own Python reader: Debian forky's python3-gguf) reads in each GGUF file:
its architecture, every scalar field, every tensor's shape as llama.cpp's ne lists it, and the tensor
names that architecture does not know (gguf.MODEL_TENSORS). Runs in the forky chroot; prints one JSON
line {PATH: {...}, "_version": ...}.
  gguf_fields.py FILE.gguf ..."""
import importlib.metadata
import json
import sys

import gguf


def known_names(arch_name, n_layers):
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    names = set()
    for t in gguf.MODEL_TENSORS[arch]:
        pattern = gguf.TENSOR_NAMES[t]
        for b in range(n_layers):
            names.add(pattern.format(bid=b) + ".weight")
            names.add(pattern.format(bid=b) + ".bias")
    return names


def main():
    out = {"_version": importlib.metadata.version("gguf")}
    for path in sys.argv[1:]:
        r = gguf.GGUFReader(path)
        fields = {}
        for name, f in r.fields.items():
            if name.startswith("GGUF."):
                continue
            v = f.contents()
            if isinstance(v, (int, float, str, bool)):
                fields[name] = v
        arch = fields["general.architecture"]
        layers = fields[arch + ".block_count"]
        tensors = {t.name: [int(x) for x in t.shape] for t in r.tensors}
        known = known_names(arch, layers)
        out[path] = {"fields": fields, "tensors": tensors, "unknown": sorted(n for n in tensors if n not in known)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
