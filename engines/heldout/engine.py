#!/usr/bin/env python3
"""A serving engine written from docs/protocol.md alone, as a user would write one: slots of preallocated
key/value buffers written in place (grown by doubling), rows by id, protocol 3's extend, save/restore and
shift. Nothing of the example engine (engines/reference/) is used; the weights and the layers' modules are
the series' model (tests/interop/series_reference.py), the cache and its bookkeeping are this file's.

It is held out: the suite's diagnosis was never tuned on it. HELDOUT_BUG=NAME plants one of its own bugs
(names of its own, not the fault table's):
  dirty-slot            a released slot keeps its buffers; the next row placed there starts on them
  rewind-drops-history  a rollback first cuts the row to its last `context` entries, then drops n
  rewind-one-short      a rollback drops n - 1 entries
  fork-shallow          a fork hands the child the parent's buffers (both write the same memory)
  shift-stale-keys      a context shift moves the kept keys down without turning them back
  shift-short-turn      a context shift turns the kept keys back by discard - 1 positions
  chunk-from-zero       an extend turns its chunk as positions 0.. (stored after the row, where it belongs)
  save-window-only      a saved state holds the last `context` entries only
  shift-pos-unmoved     after a context shift, new tokens are turned at the positions they had before it
  state-minus-oldest    a saved state leaves out the row's oldest 16 entries
  window-one-short      a query attends to the `context` - 1 keys before it, not `context`
  step-turn-early       a one-token step is turned one position early
  values-as-keys        each new token's key is stored where its value goes and the value where the key goes
  no-causal-prefill     a prompt's tokens see the whole prompt, later tokens too
  value-turned          values are turned by RoPE as keys are
  window-never-trimmed  a query attends to every entry the row holds, however old
  restore-at-window     a restored row longer than `context` continues as if it were `context` long
"""
import base64
import io
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "interop"))
import series_reference as model_code  # noqa: E402

BUGS = {"dirty-slot", "rewind-drops-history", "rewind-one-short", "fork-shallow", "shift-stale-keys", "shift-short-turn",
        "chunk-from-zero", "save-window-only", "shift-pos-unmoved", "state-minus-oldest", "window-one-short", "step-turn-early",
        "values-as-keys", "no-causal-prefill", "value-turned", "window-never-trimmed", "restore-at-window"}
BUG = os.environ.get("HELDOUT_BUG", "")
if BUG and BUG not in BUGS:
    sys.exit("heldout engine: unknown HELDOUT_BUG %r (known: %s)" % (BUG, ", ".join(sorted(BUGS))))


def load_trusted(f):
    """torch.load of a file this engine or the suite it talks to wrote. torch 1.13's weights-only unpickler
    has no floats (the config's dropout), so it falls back to the full one: never point it at a stranger's file."""
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception:
        if hasattr(f, "seek"):
            f.seek(0)
        return torch.load(f, map_location="cpu")


class Slot:
    """One row's cache: per layer a key and a value buffer (heads, capacity, head_dim), entries 0..used-1
    valid; entry i holds position i."""

    def __init__(self, layers, heads, hd, capacity=64):
        self.k = [torch.zeros(heads, capacity, hd) for _ in range(layers)]
        self.v = [torch.zeros(heads, capacity, hd) for _ in range(layers)]
        self.used = 0
        self.turn_offset = 0  # added to a new token's position when it is turned (shift-pos-unmoved)

    def reserve(self, n):
        cap = self.k[0].shape[1]
        if n <= cap:
            return
        while cap < n:
            cap *= 2
        for layer in range(len(self.k)):
            for bufs in (self.k, self.v):
                grown = torch.zeros(bufs[layer].shape[0], cap, bufs[layer].shape[2])
                grown[:, :self.used] = bufs[layer][:, :self.used]
                bufs[layer] = grown

    def copy(self):
        s = Slot.__new__(Slot)
        s.k = [b.clone() for b in self.k]
        s.v = [b.clone() for b in self.v]
        s.used = self.used
        s.turn_offset = self.turn_offset
        return s


class Engine:
    def __init__(self):
        self.net = None
        self.slots = {}     # row id -> Slot
        self.retired = {}   # row id -> the Slot its last row left (dirty-slot)

    def load(self, path):
        ck = load_trusted(path)
        self.net = model_code.GPT(ck["config"]).eval()
        self.net.load_state_dict(ck["model"])
        c = ck["config"]
        self.ctx, self.heads, self.layers = c["context"], c["n_heads"], c["n_layers"]
        self.hd = c["d_model"] // c["n_heads"]
        freq = 10000.0 ** (-torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd)
        self.freq = freq

    def new_slot(self):
        rid = 0
        while rid in self.slots:
            rid += 1
        old = self.retired.pop(rid, None)
        self.slots[rid] = old if (old is not None and BUG == "dirty-slot") else Slot(self.layers, self.heads, self.hd)
        if BUG != "dirty-slot" or old is None:
            self.slots[rid].used = 0
        return rid

    @torch.no_grad()
    def run(self, slot, ids, start, turned_at=None):
        """ids at positions start.. through `slot` (entries below `start` kept, the rest overwritten):
        the last position's logits, (V). `turned_at`: the position RoPE turns the first of them to (start)."""
        turned_at = (start if turned_at is None else turned_at) + slot.turn_offset
        if BUG == "step-turn-early" and len(ids) == 1 and turned_at > 0:
            turned_at -= 1
        reach = self.ctx - 1 if BUG == "window-one-short" else self.ctx
        net = self.net
        x = net.emb(torch.tensor([ids], dtype=torch.long))
        T, C = len(ids), x.shape[-1]
        slot.reserve(start + T)
        for layer, blk in enumerate(net.blocks):
            a = blk.attn
            h = blk.norm1(x)
            q, k, v = a.qkv(h).split(C, dim=-1)
            q, k, v = (t.view(1, T, self.heads, self.hd).transpose(1, 2) for t in (q, k, v))
            q, k = model_code.rope_at(q, turned_at), model_code.rope_at(k, turned_at)
            if BUG == "value-turned":
                v = model_code.rope_at(v, turned_at)
            if BUG == "values-as-keys":
                k, v = v, k
            slot.k[layer][:, start:start + T] = k[0]
            slot.v[layer][:, start:start + T] = v[0]
            lo = 0 if BUG == "window-never-trimmed" else max(0, start - reach)
            K, V = slot.k[layer][:, lo:start + T].unsqueeze(0), slot.v[layer][:, lo:start + T].unsqueeze(0)
            att = q @ K.transpose(-2, -1) / math.sqrt(self.hd)
            keypos = torch.arange(lo, start + T)
            qpos = torch.arange(start, start + T).unsqueeze(1)
            seen = (keypos >= qpos - reach) if BUG != "window-never-trimmed" else torch.ones_like(keypos >= qpos)
            if BUG != "no-causal-prefill":
                seen = seen & (keypos <= qpos)
            att = att.masked_fill(~seen, float("-inf"))
            y = (att.softmax(-1) @ V).transpose(1, 2).reshape(1, T, C)
            x = x + a.out(y)
            x = x + blk.mlp(blk.norm2(x))
        slot.used = start + T
        return net.head(net.norm(x))[0, -1].tolist()

    def live(self, rid):
        if rid not in self.slots:
            raise ValueError("row %r is not live" % rid)
        return self.slots[rid]

    def turn(self, keys, d):
        """keys (H, L, hd) turned back by d positions (RoPE's pairs of adjacent entries), in double."""
        ang = -d * self.freq
        c, s = ang.cos(), ang.sin()
        kd = keys.double()
        a, b = kd[..., 0::2], kd[..., 1::2]
        return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2).float()

    def handle(self, req):
        op = req.get("op")
        if op == "hello":
            return {"ok": True, "name": "heldout" + (" (%s)" % BUG if BUG else ""), "formats": ["pt"], "protocol": 3,
                    "operations": ["ragged", "join", "fork", "truncate", "extend", "save", "shift"], "sampler": False}
        if op == "load":
            self.load(req["checkpoint"])
            return {"ok": True}
        if op == "reset":
            self.slots, self.retired = {}, {}
            return {"ok": True}
        if op == "prefill":
            made, out = [], []
            for ids in req["ids"]:
                rid = self.new_slot()
                slot = self.slots[rid]
                out.append(self.run(slot, ids, slot.used))
                made.append(rid)
            return {"ok": True, "logits": out, "rows": made}
        if op == "step":
            rows = req.get("rows", sorted(self.slots))
            if len(rows) != len(req["ids"]):
                raise ValueError("one id per row")
            out = []
            for rid, ids in zip(rows, req["ids"]):
                s = self.live(rid)
                out.append(self.run(s, ids, s.used))
            return {"ok": True, "logits": out}
        if op == "extend":
            s = self.live(req["row"])
            return {"ok": True, "logits": [self.run(s, req["ids"], s.used, 0 if BUG == "chunk-from-zero" else None)]}
        if op == "fork":
            src = self.live(req["row"])
            rid = self.new_slot()
            if BUG == "fork-shallow":
                child = Slot.__new__(Slot)
                child.k, child.v, child.used, child.turn_offset = src.k, src.v, src.used, src.turn_offset
                self.slots[rid] = child
            else:
                self.slots[rid] = src.copy()
            return {"ok": True, "row": rid}
        if op == "truncate":
            s, n = self.live(req["row"]), int(req["n"])
            if n < 0 or n > s.used:
                raise ValueError("cannot drop %d of %d entries" % (n, s.used))
            if BUG == "rewind-drops-history" and s.used > self.ctx:  # the entries before the window are zeroed
                for bufs in (s.k, s.v):
                    for b in bufs:
                        b[:, :s.used - self.ctx] = 0
            s.used -= n - 1 if (BUG == "rewind-one-short" and n > 0) else n
            return {"ok": True}
        if op == "release":
            s = self.slots.pop(req["row"], None)
            if s is not None:
                self.retired[req["row"]] = s
            return {"ok": True}
        if op == "save":
            s = self.live(req["row"])
            lo = max(0, s.used - self.ctx) if BUG == "save-window-only" else min(16, s.used) if BUG == "state-minus-oldest" else 0
            state = {"k": [b[:, lo:s.used].clone() for b in s.k], "v": [b[:, lo:s.used].clone() for b in s.v], "used": s.used, "lo": lo}
            buf = io.BytesIO()
            torch.save(state, buf)
            return {"ok": True, "state": base64.b64encode(buf.getvalue()).decode("ascii")}
        if op == "restore":
            state = load_trusted(io.BytesIO(base64.b64decode(req["state"])))
            rid = self.new_slot()
            s = self.slots[rid]
            s.reserve(state["used"])
            for layer in range(self.layers):
                s.k[layer][:, state["lo"]:state["used"]] = state["k"][layer]
                s.v[layer][:, state["lo"]:state["used"]] = state["v"][layer]
            s.used = state["used"]
            if BUG == "restore-at-window" and s.used > self.ctx:
                s.turn_offset = self.ctx - s.used
            return {"ok": True, "row": rid}
        if op == "shift":
            s, keep, discard = self.live(req["row"]), int(req["keep"]), int(req["discard"])
            if keep < 0 or discard < 1 or keep + discard > s.used:
                raise ValueError("cannot shift keep %d discard %d of %d entries" % (keep, discard, s.used))
            turn = 0 if BUG == "shift-stale-keys" else discard - 1 if BUG == "shift-short-turn" else discard
            for layer in range(self.layers):
                later_k = s.k[layer][:, keep + discard:s.used].clone()
                later_v = s.v[layer][:, keep + discard:s.used].clone()
                s.k[layer][:, keep:s.used - discard] = self.turn(later_k, turn) if turn else later_k
                s.v[layer][:, keep:s.used - discard] = later_v
            s.used -= discard
            if BUG == "shift-pos-unmoved":
                s.turn_offset += discard
            return {"ok": True}
        return {"ok": False, "error": "unknown op %r" % op}


def main():
    engine = Engine()
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "quit":
            return
        try:
            out = engine.handle(req)
        except Exception as e:  # a request it cannot serve is answered, never a crash
            out = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
