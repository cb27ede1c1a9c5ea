#!/usr/bin/env python3
"""The fewest requests that show llama.cpp's sliding-window cache losing what a rollback needs (docs/
engines.md, "Engines on the zoo": findings 3 and 4). One row, through an engine's conform adapter
(docs/protocol.md), in one of three ways:

  (default)       prefill 80 tokens; step 16, one request each; save the row; restore it; truncate the
                  restored row by 16; step the same 16 tokens again.
  --after-shift   prefill 180 tokens; shift the row (keep 0, discard 7); step 8; truncate by 4; step the
                  same 4 again.
  --no-restore    the default without the save and restore: the control, which must hold.

The second pass sees the same tokens at the same positions over the same history, so its logits must be
the first pass's. By default they part because llama_state_seq_get_data writes a sequence's cells of
the sliding layers' cache only where its window does not mask them from the sequence's last position
(llama-kv-cache.cpp, state_write: "check the cell is not SWA-masked"), even with swa_full: the restored
row has no keys before position 95 - 63 on those layers, and the rollback's window reaches back over
the gap. After a shift they part too; the shift alone is right (the context-shift row passes), the
rollback after it is not, and only on a model with sliding layers.

  swa_rollback.py TINYGPT ADAPTER_COMMAND MEMBER [--no-restore | --after-shift] [--expect parts|holds]
Prints the worst |diff| per re-fed step; exits 0 when the result is what --expect says (default parts)."""
import sys

from adapter_client import expectation, member_engine


def main():
    expect, args = expectation(sys.argv[1:])
    mode = "restore"
    for flag, name in (("--no-restore", "plain"), ("--after-shift", "shift")):
        if flag in args:
            mode = name
            args.remove(flag)
    tinygpt, command, member = args
    plen, steps, back = (180, 8, 4) if mode == "shift" else (80, 16, 16)
    with member_engine(tinygpt, command, member) as call:
        prompt = [(37 * i + 11) % 4096 for i in range(plen)]
        fed = [(53 * i + 7) % 4096 for i in range(steps)]
        row = call({"op": "prefill", "ids": [prompt]})["rows"][0]
        if mode == "shift":
            call({"op": "shift", "row": row, "keep": 0, "discard": 7})
        first = [call({"op": "step", "rows": [row], "ids": [[t]]})["logits"][0] for t in fed]
        if mode == "restore":
            state = call({"op": "save", "row": row})["state"]
            call({"op": "release", "row": row})
            row = call({"op": "restore", "state": state})["row"]
        call({"op": "truncate", "row": row, "n": back})
        again = [call({"op": "step", "rows": [row], "ids": [[t]]})["logits"][0] for t in fed[steps - back:]]
    worst = [max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(first[steps - back:], again)]
    start = plen - (7 if mode == "shift" else 0) + steps - back
    for k, w in enumerate(worst):
        print("position %d: |diff| %.3g" % (start + k, w))
    parts = max(worst) > 1e-3
    print("%s (%s): the re-fed steps %s the first pass (worst |diff| %.3g)" % (member, mode, "part from" if parts else "equal", max(worst)))
    sys.exit(0 if parts == (expect == "parts") else 1)


if __name__ == "__main__":
    main()
