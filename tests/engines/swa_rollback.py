#!/usr/bin/env python3
"""The fewest requests that show llama.cpp's saved state of a sliding-window model leaving out what a
rollback needs (docs/engines.md, "Engines on the zoo"). One row, through an engine's conform adapter
(docs/protocol.md):

  prefill 80 tokens; step 16 tokens one request each; save the row; restore it; truncate the restored
  row by 16; step the same 16 tokens again.

The second pass sees the same tokens at the same positions over the same history, so its logits must be
the first pass's. llama.cpp's llama_state_seq_get_data writes a sequence's cells of the sliding layers'
cache only where its window does not mask them from the sequence's last position (llama-kv-cache.cpp,
state_write: "check the cell is not SWA-masked"), even with swa_full: the restored row has no keys
before position 95 - 63 on those layers, and a rollback's window reaches back over the gap. Without
the save and restore the same rollback holds (--no-restore: the control).

  swa_rollback.py TINYGPT ADAPTER_COMMAND MEMBER [--no-restore] [--expect parts|holds]
Prints the worst |diff| per re-fed step; exits 0 when the result is what --expect says (default parts)."""
import sys

from adapter_client import expectation, member_engine


def main():
    expect, args = expectation(sys.argv[1:])
    restore = "--no-restore" not in args
    args = [a for a in args if a != "--no-restore"]
    tinygpt, command, member = args
    with member_engine(tinygpt, command, member) as call:
        prompt = [(37 * i + 11) % 4096 for i in range(80)]
        fed = [(53 * i + 7) % 4096 for i in range(16)]
        row = call({"op": "prefill", "ids": [prompt]})["rows"][0]
        first = [call({"op": "step", "rows": [row], "ids": [[t]]})["logits"][0] for t in fed]
        if restore:
            state = call({"op": "save", "row": row})["state"]
            call({"op": "release", "row": row})
            row = call({"op": "restore", "state": state})["row"]
        call({"op": "truncate", "row": row, "n": len(fed)})
        again = [call({"op": "step", "rows": [row], "ids": [[t]]})["logits"][0] for t in fed]
    worst = [max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(first, again)]
    for k, w in enumerate(worst):
        print("position %d: |diff| %.3g" % (len(prompt) + k, w))
    parts = max(worst) > 1e-3
    print("%s: the re-fed steps %s the first pass (worst |diff| %.3g)" % (member, "part from" if parts else "equal", max(worst)))
    sys.exit(0 if parts == (expect == "parts") else 1)


if __name__ == "__main__":
    main()
