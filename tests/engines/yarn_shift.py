#!/usr/bin/env python3
"""The fewest requests that show llama.cpp's context shift scaling the keys of a YaRN model
(docs/engines.md, "Engines on the zoo"), through an engine's conform adapter (docs/protocol.md):

  prefill rows A and B (40 tokens each); shift A (keep 4, discard 10); step B.

B was not shifted, so its step's logits must be those of the same step without the shift (the run
repeated after a reset, the shift left out). llama.cpp's K-shift rotates every cell of the cache by its
own delta (0 for cells that did not move) with the forward pass's ggml_rope_ext arguments, and with
YaRN (ext_factor != 0) ggml multiplies cos and sin by the attention factor 1 + 0.1 ln(factor): a shift
scales every key in the cache, of every sequence, by 1.139 (factor 4) once more. A model without YaRN
holds (the control).

  yarn_shift.py TINYGPT ADAPTER_COMMAND MEMBER [--expect parts|holds]
Prints B's worst |diff|; exits 0 when the result is what --expect says (default parts)."""
import sys

from adapter_client import expectation, member_engine


def main():
    expect, args = expectation(sys.argv[1:])
    tinygpt, command, member = args
    with member_engine(tinygpt, command, member) as call:
        a_ids = [(37 * i + 11) % 4096 for i in range(40)]
        b_ids = [(53 * i + 7) % 4096 for i in range(40)]

        def run(shift):
            call({"op": "reset"})
            a, b = call({"op": "prefill", "ids": [a_ids, b_ids]})["rows"]
            if shift:
                call({"op": "shift", "row": a, "keep": 4, "discard": 10})
            return call({"op": "step", "rows": [b], "ids": [[5]]})["logits"][0]

        plain, shifted = run(False), run(True)
    worst = max(abs(x - y) for x, y in zip(plain, shifted))
    parts = worst > 1e-3
    print("%s: row B's step %s after row A's shift (worst |diff| %.3g)" % (member, "moved" if parts else "held", worst))
    sys.exit(0 if parts == (expect == "parts") else 1)


if __name__ == "__main__":
    main()
