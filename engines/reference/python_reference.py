#!/usr/bin/env python3
"""An example engine for `tinygpt conform`: the independent Python implementation of the series'
GPT that the interop tests use (tests/interop/series_reference.py), with its own SPEC 6 sampler,
behind protocol version 1 (one JSON object per line each way; see the README, "Verify an engine
in any language"). Needs only Debian's python3-torch.

Variants for the suite's own tests (TINYGPT_ENGINE_FAULT=NAME[,NAME...]):
  planted faults, each a real bug that a check must catch:
    rope-offset        decode steps rotate q and k at position 0 (the seed's first bug)
    topleft-mask       a top-left causal mask on the single decode query: it sees key 0 only (the seed's second)
    no-reset           `reset` does nothing: the next prefill continues the old sequence
    top-p-boundary     the nucleus also drops the token whose own mass reaches top_p
    penalty-divides-negatives  the penalty divides every seen score, raising a negative one
    temperature-multiplies     scores multiplied by the temperature instead of divided
    top-k-widens       top-k keeps the k + 1 best
    f16-cache          keys and values stored in float16 (a cache bug under our fp32 contract)
    chunk-positions-restart  `extend` numbers a chunk's tokens from 0, not from the row's next position
    reused-prefix-too-long   a fully cached prompt keeps every entry and feeds its last token again after them
    position-by-request      a step's positions read by request index, not by row (the i-th live row's counter)
    restore-position-from-window  a restored row's position taken from its window's length (wrong past the window)
    state-by-reference  `save` answers a key into this process's memory, not the entries: restores in this process only
    shift-keys-not-rotated   a context shift renumbers the kept entries but leaves their keys as rotated
    threads-race       one logit moves whenever the engine runs on more than one thread
    joined-at-batch-position  `generate`: a sequence admitted while others decode is stepped at the engine's step count
    shared-generator   `sample` with per-row seeds draws every row from one generator, seeded with the first row's seed
    seeds-need-every-row  a batch with one unseeded row draws every row unseeded (vLLM #51226)
    live-row-reused    a prompt's prefix taken from a row still running, whose entries are cut under it
    shifted-entries-reused  a context shift's kept later tokens still offered as a later prompt's prefix
    reused-past-the-window  a prefix served from a left row that ran past the window, read as a ring of
                       `context` slots would hold it (its first entries overwritten by later ones)
    state-saved-without-history  `save` keeps the window's entries only: a rollback after the restore
                       has nothing to bring back
    fork-shares-storage  `fork` hands the child its parent's list of entries (one object): each one's
                       appends land in the other's cache
    released-slot-not-reset  a released row's entries stay in its slot; a row admitted into the slot
                       starts on them
    released-slot-kept-on-reuse  the same, and a prompt served a reused prefix in that slot takes the
                       prefix after the stale entries (the slot is never emptied)
    reused-one-past-the-prefix  a prompt cache reuses one entry past the prefix the prompt shares (the
                       cached row's next entry, another token's)
    shift-off-by-one   a context shift rotates the kept keys back one position too few
    rollback-keeps-one  `truncate` drops one entry too few (its position moves back by n)
  what real engines do on purpose:
    one-sequence       hello says max_rows 1 (wllama's one sequence), and a request for more rows is refused
    log-probabilities  every logits answer is the log-softmax of the logits (wllama's probabilities, logged)
    never-trims        a row attends to every entry it stored, past the window too (transformers' DynamicCache)
    seed-sampler       the seed's pick() as written: top-p over torch.sort(descending=True), not stable
    top-k-exact        top-k keeps exactly k tokens, ties broken by torch.topk (llama.cpp's policy)
    gelu-tanh          GELU by the tanh approximation (llama.cpp's ggml_gelu)
TINYGPT_ENGINE_DECLARE=a,b adds `deviations` to the hello answer (e.g. gelu-tanh, top-k-exact).
Speculative decoding (op `speculate`, protocol 3) is speculative.py's, with its own planted faults
(spec-*: listed there); TINYGPT_ENGINE_SPEC_DRAFTS=a,b limits the draft kinds hello offers.

Protocol 2 (rows by id: ragged prefills, rows joining and leaving, fork, truncate): each row keeps
its own cache, every entry it ever stored, and attends to its window (the newest `context` plus the
new ones); a rollback past the window brings the older entries back, as SPEC 4's window over the
remaining sequence requires. Protocol 3 adds `extend` (several tokens appended to a row in one
request) and prompt caching: a released row is kept, and a new prompt that shares a prefix with it
takes its entries up to that prefix (never the prompt's last token, whose logits are the answer) and
computes the rest; the prefill answer says how many entries each row reused ("reused"); `save`
(a row's state as base64 of its pickled entries and position) with `restore` (a new row from it);
and `shift` (llama.cpp's context shift: entries dropped after the first `keep`, the later ones
renumbered, their keys rotated back by RoPE's formula). `threads` (any protocol from 2) sets torch's intra-op threads and answers the count before. `sample` with "rows" (`row-sampling`, any protocol from 2) draws each row with its own settings and its own generator. `generate` (protocol 3) runs requests through the engine's own continuous-batching scheduler. TINYGPT_ENGINE_PROTOCOL=1 or 2 makes it an engine of that protocol.
"""
import base64
import io
import math
import os
import pickle
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "interop"))
import series_reference as ref  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # engines/: serve.py
from serve import serve  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import speculative  # noqa: E402

VARIANTS = set(v for v in os.environ.get("TINYGPT_ENGINE_FAULT", "").split(",") if v)
KNOWN = {"rope-offset", "topleft-mask", "no-reset", "top-p-boundary", "penalty-divides-negatives", "temperature-multiplies",
         "top-k-widens", "f16-cache", "chunk-positions-restart", "reused-prefix-too-long", "position-by-request",
         "restore-position-from-window", "state-by-reference", "shift-keys-not-rotated", "threads-race",
         "shared-generator", "seeds-need-every-row", "joined-at-batch-position", "live-row-reused", "shifted-entries-reused",
         "reused-past-the-window", "state-saved-without-history", "fork-shares-storage", "released-slot-not-reset",
         "released-slot-kept-on-reuse", "reused-one-past-the-prefix",
         "shift-off-by-one", "rollback-keeps-one",
         "seed-sampler", "top-k-exact", "gelu-tanh", "one-sequence", "log-probabilities", "never-trims"} | speculative.FAULTS
DECLARE = [d for d in os.environ.get("TINYGPT_ENGINE_DECLARE", "").split(",") if d]
# The draft kinds hello offers (all by default); TINYGPT_ENGINE_SPEC_DRAFTS=ngram,none makes an engine that
# drafts as llama-server's n-gram types do, with no way to be handed drafts.
SPEC_DRAFTS = [d for d in os.environ.get("TINYGPT_ENGINE_SPEC_DRAFTS", ",".join(speculative.DRAFTS)).split(",") if d]


# The planted model faults live in the batched protocol 1 path; with one of them the engine stays there.
PROTOCOL = 1 if VARIANTS & {"rope-offset", "topleft-mask", "no-reset", "f16-cache"} else int(os.environ.get("TINYGPT_ENGINE_PROTOCOL", "3"))
OPERATIONS = {2: ["ragged", "join", "fork", "truncate", "bench", "threads", "row-sampling"],
              3: ["ragged", "join", "fork", "truncate", "bench", "threads", "row-sampling", "extend", "save", "shift", "generate",
                  "generate-shift", "speculate"]}


def has(name):
    return name in VARIANTS


def keeps_slots():
    """A released row's entries stay in its slot (planted: released-slot-not-reset, released-slot-kept-on-reuse)."""
    return has("released-slot-not-reset") or has("released-slot-kept-on-reuse")


@torch.no_grad()
def row_forward(model, ids, row, start, every=False):
    """One row's tokens ids (1, T) at positions start.. through the row's own cache (a list of per-layer
    [K, V] holding every entry the row stored); each new token attends to itself and the `context` keys
    before it (the window), in causal order. (V) logits of the last, or with `every` (T, V) of each."""
    ctx = model.c["context"]
    x = model.emb(ids)
    B, T, C = x.shape
    for layer, b in enumerate(model.blocks):
        a = b.attn
        h = b.norm1(x)
        q, k, v = a.qkv(h).split(C, dim=-1)
        q, k, v = (t.view(B, T, a.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = ref.rope_at(q, start), ref.rope_at(k, start)
        K, V = row["kv"][layer]
        seen = K.shape[2] if has("never-trims") else min(K.shape[2], ctx)
        Ka = torch.cat([K[:, :, K.shape[2] - seen:], k], dim=2)
        Va = torch.cat([V[:, :, V.shape[2] - seen:], v], dim=2)
        row["kv"][layer] = [torch.cat([K, k], dim=2), torch.cat([V, v], dim=2)]
        att = q @ Ka.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if T > 1:
            S = Ka.shape[2]
            key = torch.arange(S) - seen  # each key's position relative to the first new token
            query = torch.arange(T).unsqueeze(1)
            mask = key <= query
            if not has("never-trims"):
                mask = mask & (key >= query - ctx)
            att = att.masked_fill(~mask, float("-inf"))
        y = (att.softmax(-1) @ Va).transpose(1, 2).reshape(B, T, C)
        x = x + a.out(y)
        x = x + b.mlp(b.norm2(x))
    out = model.head(model.norm(x))[0]  # (T, V)
    return out if every else out[-1]


def f16_forward(self, x, cache=None, start=0):
    """Attention.forward with the cache held in float16: what is stored loses precision."""
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
    q, k = ref.rope_at(q, start), ref.rope_at(k, start)
    if cache is not None:
        if "k" in cache:
            k = torch.cat([cache["k"].float(), k], dim=2)
            v = torch.cat([cache["v"].float(), v], dim=2)
        cache["k"], cache["v"] = k[:, :, -self.context:].half(), v[:, :, -self.context:].half()
    att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if T > 1:
        S = k.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        att = att.masked_fill(~mask, float("-inf"))
    y = att.softmax(-1) @ v
    return self.out(y.transpose(1, 2).reshape(B, T, C))


def topleft_forward(self, x, cache=None, start=0):
    """Attention.forward with the seed's second bug: tril() without the offset, also for T = 1."""
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
    q, k = ref.rope_at(q, start), ref.rope_at(k, start)
    if cache is not None:
        if "k" in cache:
            k = torch.cat([cache["k"], k], dim=2)
            v = torch.cat([cache["v"], v], dim=2)
        cache["k"], cache["v"] = k[:, :, -self.context:], v[:, :, -self.context:]
    att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, k.shape[2], dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    y = att.softmax(-1) @ v
    return self.out(y.transpose(1, 2).reshape(B, T, C))


class Engine:
    def __init__(self):
        self.model = None
        self.speculative = speculative.Speculative(self, has)
        self.reset()

    # What the speculative module reads: the row forward pass, the sampler's distribution, dropping entries.
    forward = staticmethod(row_forward)

    def probs(self, logits, history, settings):
        """SPEC 6's distribution after the pipeline over `history`: (V) float64; temperature 0 one-hot at the
        argmax of the penalised scores."""
        x = logits.detach().float().clone().unsqueeze(0)
        y = scores(x, [history], *settings)
        if y is None:
            out = torch.zeros(x.shape[1], dtype=torch.float64)
            out[int(x[0].argmax())] = 1
            return out
        return y[0].double().softmax(-1)

    def drop_entries(self, row, n):
        if n > 0:
            row["kv"] = [[K[:, :, :K.shape[2] - n], V[:, :, :V.shape[2] - n]] for K, V in row["kv"]]
            row["pos"] -= n

    def load_draft(self, path):
        ck = read_pt(path)
        model = ref.GPT(ck["config"]).eval()
        model.load_state_dict(ck["model"])
        if model.c["vocab_size"] != self.model.c["vocab_size"]:
            raise ValueError("the draft's vocabulary (%d) is not the target's (%d)" % (model.c["vocab_size"], self.model.c["vocab_size"]))
        return model

    def reset(self):
        self.caches, self.pos = None, 0
        self.rows = {}  # protocol 2: row id -> {"kv": [[K, V] per layer], "pos": next position, "ids": the ids fed}
        self.released = []  # protocol 3: rows that left, newest last, for prompts that share their prefix
        self.slots = {}  # planted released-slot-not-reset: row id -> the entries its last occupant left

    def new_row(self):
        layers, heads = len(self.model.blocks), self.model.blocks[0].attn.n_heads
        hd = self.model.c["d_model"] // heads
        empty = lambda: torch.zeros(1, heads, 0, hd)  # noqa: E731
        rid = next(i for i in range(len(self.rows) + 1) if i not in self.rows)
        kv = self.slots.pop(rid, None) if keeps_slots() else None
        self.rows[rid] = {"kv": kv or [[empty(), empty()] for _ in range(layers)], "pos": 0, "ids": []}
        return rid

    def take_released(self, prompt):
        """The released row sharing the longest prefix with `prompt` (taken out of the pool), and how long."""
        best, shared = None, 0
        ctx = self.model.c["context"]
        pool = list(self.released) + (list(self.rows.values()) if has("live-row-reused") else [])
        for i, row in enumerate(pool):
            if row["pos"] > ctx and not has("reused-past-the-window"):
                continue  # its window moved on: keep it simple, as our library does
            n = 0
            for a, b in zip(prompt, row["ids"]):
                if a != b:
                    break
                n += 1
            if n > shared:
                best, shared = i, n
        if best is None:
            return None, 0
        row = pool[best]
        if best < len(self.released):
            self.released.pop(best)
        if row["pos"] > ctx:  # planted: its entries read as a ring of `ctx` slots holds them, latest first
            idx = torch.tensor([i + ((row["pos"] - 1 - i) // ctx) * ctx for i in range(min(shared, ctx))])
            row = dict(row, kv=[[K[:, :, idx], V[:, :, idx]] for K, V in row["kv"]])
        return row, shared

    def add_rows(self, ids):
        if self.model is None:
            raise ValueError("no model loaded")
        out, made, reused = [], [], []
        ctx = self.model.c["context"]
        for r in ids:
            if not r:
                raise ValueError("an empty row")
            fed = list(r[-ctx:])
            old, shared = self.take_released(fed) if PROTOCOL >= 3 and len(r) <= ctx else (None, 0)
            keep = shared if has("reused-prefix-too-long") else min(shared, len(fed) - 1)
            if has("reused-one-past-the-prefix") and old is not None and 0 < shared < min(len(old["ids"]), len(fed) - 1):
                keep = shared + 1  # planted: the cached row's next entry, another token's, reused too
            rid = self.new_row()
            row = self.rows[rid]
            if old is not None and keep > 0:
                prefix = [[K[:, :, :keep], V[:, :, :keep]] for K, V in old["kv"]]
                if has("released-slot-kept-on-reuse"):  # planted: the prefix after the slot's stale entries
                    prefix = [[torch.cat([K0, K], 2), torch.cat([V0, V], 2)] for (K0, V0), (K, V) in zip(row["kv"], prefix)]
                row["kv"] = prefix
                if has("live-row-reused") and any(old is r for r in self.rows.values()):  # planted: the running row cut
                    old["kv"], old["pos"], old["ids"] = [[K.clone(), V.clone()] for K, V in row["kv"]], keep, old["ids"][:keep]
                row["pos"], row["ids"] = keep, fed[:keep]
                fed = fed[min(keep, len(fed) - 1):]  # at least the last token is computed: its logits are the answer
            x = torch.tensor([fed], dtype=torch.long)
            out.append(row_forward(self.model, x, row, row["pos"]).tolist())
            row["pos"] += x.shape[1]
            row["ids"] += fed
            made.append(rid)
            reused.append(keep if old is not None and keep > 0 else 0)
        self.reused = reused
        return out, made

    def step_rows(self, rows, ids):
        out = []
        order = list(self.rows)  # the engine's own order of its live rows
        for i, (rid, r) in enumerate(zip(rows, ids)):
            if rid not in self.rows or len(r) != 1:
                raise ValueError("row %r is not live, or not one id" % rid)
            row = self.rows[rid]
            counter = self.rows[order[i]] if has("position-by-request") else row
            out.append(row_forward(self.model, torch.tensor([r], dtype=torch.long), row, counter["pos"]).tolist())
            counter["pos"] += 1
            row["ids"] += r
        return out

    def extend(self, rid, ids):
        """Several tokens appended to a row in one call, at its next positions: (V) logits of the last."""
        if rid not in self.rows or not ids:
            raise ValueError("row %r is not live, or no ids" % rid)
        row = self.rows[rid]
        if row["pos"] + len(ids) > self.model.c["context"]:
            raise ValueError("a chunk must end inside the window")
        start = 0 if has("chunk-positions-restart") else row["pos"]
        out = row_forward(self.model, torch.tensor([ids], dtype=torch.long), row, start).tolist()
        row["pos"] += len(ids)
        row["ids"] += ids
        return out

    def fork(self, rid):
        if rid not in self.rows:
            raise ValueError("row %r is not live" % rid)
        new = self.new_row()
        src = self.rows[rid]
        kv = src["kv"] if has("fork-shares-storage") else [[K.clone(), V.clone()] for K, V in src["kv"]]
        self.rows[new] = {"kv": kv, "pos": src["pos"], "ids": list(src["ids"])}
        return new

    def save(self, rid):
        if rid not in self.rows:
            raise ValueError("row %r is not live" % rid)
        if has("state-by-reference"):  # planted: the state names this process's copy of the row
            self.kept = getattr(self, "kept", {})
            key = "kept-%d" % len(self.kept)
            src = self.rows[rid]
            self.kept[key] = {"kv": [[K.clone(), V.clone()] for K, V in src["kv"]], "pos": src["pos"], "ids": list(src["ids"])}
            return base64.b64encode(key.encode("ascii")).decode("ascii")
        buf = io.BytesIO()
        saved = self.rows[rid]
        if has("state-saved-without-history"):  # planted: the window's entries only
            ctx = self.model.c["context"]
            saved = dict(saved, kv=[[K[:, :, -ctx:], V[:, :, -ctx:]] for K, V in saved["kv"]])
        torch.save(saved, buf)
        return base64.b64encode(buf.getvalue()).decode("ascii")

    def restore(self, state):
        raw = base64.b64decode(state, validate=True)
        if has("state-by-reference") and raw.startswith(b"kept-"):
            kept = getattr(self, "kept", {}).get(raw.decode("ascii"))
            if kept is None:
                raise ValueError("no saved row %r in this process" % raw.decode("ascii"))
            rid = self.new_row()
            self.rows[rid] = {"kv": [[K.clone(), V.clone()] for K, V in kept["kv"]], "pos": kept["pos"], "ids": list(kept["ids"])}
            return rid
        row = torch.load(io.BytesIO(raw), weights_only=True)
        if has("restore-position-from-window"):
            row["pos"] = min(row["pos"], self.model.c["context"])
        rid = self.new_row()
        self.rows[rid] = row
        return rid

    def shift(self, rid, keep, discard):
        """A context shift: drops `discard` entries after the first `keep`; the later ones move down by
        `discard` positions, their keys rotated back by that many (in double, then float32)."""
        row = self.rows.get(rid)
        if row is None or keep < 0 or discard < 1 or keep + discard > row["pos"]:
            raise ValueError("cannot drop %r entries after the first %r of row %r" % (discard, keep, rid))
        rot = 0 if has("shift-keys-not-rotated") else discard - 1 if has("shift-off-by-one") else discard
        kv = []
        for K, V in row["kv"]:
            later = K[:, :, keep + discard:].double()
            hd = K.shape[3]
            angle = -rot * 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            c, s = angle.cos(), angle.sin()
            a, b = later[..., 0::2], later[..., 1::2]
            rotated = torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2).to(K.dtype)
            kv.append([torch.cat([K[:, :, :keep], rotated], 2), torch.cat([V[:, :, :keep], V[:, :, keep + discard:]], 2)])
        row["kv"] = kv
        row["pos"] -= discard
        # The kept later entries were computed beside the dropped tokens: never a later prompt's prefix.
        later = row["ids"][keep + discard:] if has("shifted-entries-reused") else [-1] * (len(row["ids"]) - keep - discard)
        row["ids"] = row["ids"][:keep] + later

    @torch.no_grad()
    def generate(self, requests, budget=48):
        """Requests this engine schedules itself (op `generate`), continuous batching as serving engines do
        it: each engine step admits the requests that have arrived (after `after` tokens made since the
        first, after the requests in `after_finished` finished), feeds prompts in chunks under a budget of
        `budget` prompt tokens a step (a long prompt takes several steps while others decode), serves a
        prompt's prefix from a finished request's row (the prompt cache of `prefill`), forks a row for a
        request's extra copies once its prompt is in, and decodes one greedy token for every sequence
        whose prompt is done. Every sequence's ids, the logits each was chosen from, and what it reused."""
        if self.model is None:
            raise ValueError("no model loaded")
        pending, live, results = [dict(q) for q in requests], [], []
        left = {q["id"]: int(q.get("copies", 1)) for q in requests}
        made = steps = 0
        while pending or live:
            arrived = [q for q in pending if made >= q.get("after", 0) and all(left.get(f, 0) == 0 for f in q.get("after_finished", []))]
            if not arrived and not live:
                arrived = pending[:1]  # nothing runs to make the tokens it waits for
            for q in arrived:
                pending.remove(q)
                fed = [int(i) for i in q["ids"]]
                past = int(q.get("keep", -1)) >= 0  # it may outgrow the window: shifted when it fills it
                if not fed or len(fed) > self.model.c["context"] or (not past and len(fed) + int(q["n"]) > self.model.c["context"]):
                    raise ValueError("request %r: a prompt of 1 to context - n tokens (context tokens with keep)" % q["id"])
                old, shared = self.take_released(fed)
                keep = min(shared, len(fed) - 1) if old is not None else 0
                rid = self.new_row()
                if keep > 0:
                    row = self.rows[rid]
                    row["kv"] = [[K[:, :, :keep], V[:, :, :keep]] for K, V in old["kv"]]
                    row["pos"], row["ids"] = keep, fed[:keep]
                live.append({"q": q, "copy": 0, "row": rid, "todo": fed[keep:], "ids": [], "logits": [], "reused": keep,
                             "joined": made > 0, "next": None})
            budget_left = budget
            for s in list(live):
                row = self.rows[s["row"]]
                if s["todo"]:  # the prompt, a chunk at a time
                    take = s["todo"][:max(1, budget_left)]
                    budget_left -= len(take)
                    out = row_forward(self.model, torch.tensor([take], dtype=torch.long), row, row["pos"])
                    row["pos"] += len(take)
                    row["ids"] += take
                    s["todo"] = s["todo"][len(take):]
                    if not s["todo"]:
                        s["next"] = out
                        for c in range(1, int(s["q"].get("copies", 1))):  # forks share nothing they write
                            live.append(dict(s, copy=c, row=self.fork(s["row"]), ids=[], logits=[]))
                    continue
                tok = int(s["next"].argmax())
                s["ids"].append(tok)
                s["logits"].append(s["next"].tolist())
                made += 1
                if len(s["ids"]) == int(s["q"]["n"]):
                    live.remove(s)
                    results.append({"id": s["q"]["id"], "copy": s["copy"], "ids": s["ids"], "logits": s["logits"], "reused": s["reused"],
                                    "shifts": s.get("shifts", [])})
                    left[s["q"]["id"]] -= 1
                    self.released = (self.released + [self.rows.pop(s["row"])])[-8:]
                    continue
                if int(s["q"].get("keep", -1)) >= 0 and row["pos"] >= self.model.c["context"]:
                    # A full window: shifted as llama-server does (a slot of context + 1 cells), keeping `keep`
                    # and dropping half of the rest, before the token is fed.
                    keep = int(s["q"]["keep"])
                    discard = (row["pos"] - keep) // 2
                    self.shift(s["row"], keep, discard)
                    s.setdefault("shifts", []).append({"before": len(s["ids"]) - 1, "keep": keep, "discard": discard})
                # planted: a sequence that joined a running batch is stepped at the batch's position
                start = steps if has("joined-at-batch-position") and s["joined"] else row["pos"]
                s["next"] = row_forward(self.model, torch.tensor([[tok]], dtype=torch.long), row, start)
                row["pos"] += 1
                row["ids"].append(tok)
            steps += 1
        return results

    def truncate(self, rid, n):
        row = self.rows[rid]
        if n < 0 or n > row["pos"]:
            raise ValueError("cannot drop %d tokens" % n)
        drop = n - 1 if has("rollback-keeps-one") and n > 0 else n
        row["kv"] = [[K[:, :, :K.shape[2] - drop], V[:, :, :V.shape[2] - drop]] for K, V in row["kv"]]
        row["pos"] -= n
        row["ids"] = row["ids"][:len(row["ids"]) - n]

    def load(self, req):
        if req.get("format") != "pt":
            raise ValueError("this engine loads format pt only")
        ck = read_pt(req["checkpoint"])
        self.speculative.forget()
        model = ref.GPT(ck["config"]).eval()
        model.load_state_dict(ck["model"])
        for b in model.blocks:
            if has("topleft-mask"):
                b.attn.forward = topleft_forward.__get__(b.attn)
            elif has("f16-cache"):
                b.attn.forward = f16_forward.__get__(b.attn)
            if has("gelu-tanh"):
                b.mlp[1] = torch.nn.GELU(approximate="tanh")
        self.model = model
        self.reset()

    @torch.no_grad()
    def run(self, ids, is_step):
        if self.model is None:
            raise ValueError("no model loaded")
        x = torch.tensor(ids, dtype=torch.long)
        if x.dim() != 2 or x.shape[1] < 1 or (is_step and x.shape[1] != 1):
            raise ValueError("ids must be B rows of equal length (1 for step)")
        if self.caches is None:
            self.caches = [{} for _ in self.model.blocks]
        start = 0 if (is_step and has("rope-offset")) else self.pos
        logits = self.model(x, self.caches, start)[:, -1]  # (B, V)
        self.pos += x.shape[1]
        return logits.tolist()

    @torch.no_grad()
    def bench(self, ids, n, threads):
        """The engine's own greedy loop, timed here: prefill, then n one-token steps, inside the window."""
        if self.model is None:
            raise ValueError("no model loaded")
        x = torch.tensor(ids, dtype=torch.long)
        if x.dim() != 2 or n < 1 or x.shape[1] + n > self.model.c["context"]:
            raise ValueError("bench takes B rows of equal length and n >= 1 steps inside the window")
        torch.set_num_threads(threads)
        caches = [{} for _ in self.model.blocks]
        t0 = time.perf_counter()
        logits = self.model(x, caches, 0)[:, -1]
        t1 = time.perf_counter()
        out, pos = [], x.shape[1]
        for _ in range(n):
            nxt = logits.argmax(-1, keepdim=True)  # (B, 1)
            out.append(nxt)
            logits = self.model(nxt, caches, pos)[:, -1]
            pos += 1
        t2 = time.perf_counter()
        out.append(logits.argmax(-1, keepdim=True))
        return {"ok": True, "prefill_s": t1 - t0, "decode_s": t2 - t1, "ids": torch.cat(out, 1).tolist()}


def read_pt(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch 1.13's weights-only unpickler lacks BINFLOAT (the config's dropout); the file
        # is the one the suite just wrote, so the full unpickler is safe here.
        return torch.load(path, map_location="cpu")


def scores(x, hist, t, k, p, r):
    """SPEC 6's stages 1-4 in the seed's order on x (B, V), each row with its own history: the scores the
    draw uses, or None at temperature 0 (then x holds the penalised scores and the argmax is the pick)."""
    B, V = x.shape
    if r != 1.0:
        for b in range(B):
            seen = torch.tensor(sorted(set(hist[b])), dtype=torch.long)
            if seen.numel():
                s = x[b, seen]
                x[b, seen] = s / r if has("penalty-divides-negatives") else torch.where(s > 0, s / r, s * r)
    if t == 0:
        return None
    x = x * t if has("temperature-multiplies") else x / t
    if 0 < k < V:
        if has("top-k-exact"):  # exactly k survive, whatever ties the k-th has
            keep = torch.zeros_like(x, dtype=torch.bool).scatter(-1, x.topk(k, dim=-1).indices, True)
            x = x.masked_fill(~keep, float("-inf"))
        else:
            kth = x.topk(min(V, k + 1) if has("top-k-widens") else k, dim=-1).values[:, -1:]
            x = x.masked_fill(x < kth, float("-inf"))
    if p < 1.0:
        # The seed's code sorts with torch.sort, which is not stable; ours ranks ties by lower index.
        srt, order = torch.sort(x, dim=-1, descending=True, stable=not has("seed-sampler"))
        probs = srt.softmax(-1)
        upto = probs.cumsum(-1)
        drop = (upto >= p) if has("top-p-boundary") else (upto - probs >= p)
        drop[:, 0] = False
        x = x.scatter(-1, order, srt.masked_fill(drop, float("-inf")))
    return x


def settings_of(d):
    return float(d["temperature"]), int(d["top_k"]), float(d["top_p"]), float(d["penalty"])


def sample(req):
    """SPEC 6 in the seed's order: penalty, temperature, top-k, top-p, then multinomial. With "rows", each
    row has its own settings and its own generator, seeded with its own seed (none: fresh entropy)."""
    x = torch.tensor([[float(v) for v in row] for row in req["logits"]], dtype=torch.float32)  # (B, V)
    B, V = x.shape
    hist = req.get("history") or [[] for _ in range(B)]
    n = int(req["n"])
    if "rows" not in req:
        y = scores(x, hist, *settings_of(req))
        if y is None:
            return x.argmax(-1, keepdim=True).repeat(1, n).tolist()
        g = torch.Generator().manual_seed(int(req["seed"]))
        return torch.multinomial(y.softmax(-1), n, replacement=True, generator=g).tolist()
    rows = req["rows"]
    if len(rows) != B:
        raise ValueError("%d row settings for %d rows" % (len(rows), B))
    seeds = [r.get("seed") for r in rows]
    if has("seeds-need-every-row") and None in seeds:  # vLLM #51226: one unseeded request unseeds the batch
        seeds = [None] * B
    shared = None
    if has("shared-generator"):  # one generator for the batch, seeded with the first row's seed
        shared = torch.Generator().manual_seed(int(seeds[0] or 0))
    out = []
    for b, r in enumerate(rows):
        xb = x[b:b + 1].clone()
        y = scores(xb, [hist[b]], *settings_of(r))
        if y is None:  # greedy: the argmax of the penalised scores
            out.append([int(xb[0].argmax())] * n)
            continue
        g = shared or (torch.Generator().manual_seed(int(seeds[b])) if seeds[b] is not None else torch.Generator())
        if shared is None and seeds[b] is None:
            g.seed()  # fresh entropy
        out.append(torch.multinomial(y.softmax(-1), n, replacement=True, generator=g)[0].tolist())
    return out


def main():
    if VARIANTS - KNOWN:
        sys.exit("python_reference.py: unknown TINYGPT_ENGINE_FAULT %r" % sorted(VARIANTS - KNOWN))
    engine = Engine()
    rows_mode = False  # protocol 2, once hello agreed on it

    def handle(req):
        nonlocal rows_mode
        op = req.get("op")
        if op == "hello":
            out = {"ok": True, "name": "python-reference" + (" (%s)" % ",".join(sorted(VARIANTS)) if VARIANTS else ""),
                   "formats": ["pt"]}
            spoken = min(PROTOCOL, req.get("protocol", 1))
            rows_mode = spoken >= 2
            if rows_mode:
                out["protocol"] = spoken
                out["operations"] = OPERATIONS[spoken]
            if DECLARE:
                out["deviations"] = DECLARE
            if has("one-sequence"):
                out["max_rows"] = 1
            if spoken >= 3:
                out["speculate"] = {"drafts": SPEC_DRAFTS, "rules": speculative.RULES}
        elif op == "load":
            engine.load(req)
            out = {"ok": True}
        elif op == "reset":
            if not has("no-reset"):
                engine.reset()
            out = {"ok": True}
        elif op == "prefill" and rows_mode:
            logits, made = engine.add_rows(req["ids"])
            out = {"ok": True, "logits": logits, "rows": made}
            if PROTOCOL >= 3:
                out["reused"] = engine.reused
        elif op == "step" and rows_mode:  # without "rows": every live row, in order
            out = {"ok": True, "logits": engine.step_rows(req.get("rows", sorted(engine.rows)), req["ids"])}
        elif op in ("prefill", "step"):
            out = {"ok": True, "logits": engine.run(req["ids"], op == "step")}
        elif op == "extend" and rows_mode:
            out = {"ok": True, "logits": [engine.extend(req["row"], req["ids"])]}
        elif op == "fork":
            out = {"ok": True, "row": engine.fork(req["row"])}
        elif op == "save" and PROTOCOL >= 3:
            out = {"ok": True, "state": engine.save(req["row"])}
        elif op == "restore" and PROTOCOL >= 3:
            out = {"ok": True, "row": engine.restore(req["state"])}
        elif op == "shift" and PROTOCOL >= 3:
            engine.shift(req["row"], req["keep"], req["discard"])
            out = {"ok": True}
        elif op == "speculate" and PROTOCOL >= 3:
            if req.get("draft") not in SPEC_DRAFTS:
                raise ValueError("this engine drafts with %s only" % SPEC_DRAFTS)
            out = dict(ok=True, **engine.speculative.run(req))
        elif op == "generate" and PROTOCOL >= 3:
            out = {"ok": True, "results": engine.generate(req["requests"])}
        elif op == "truncate":
            engine.truncate(req["row"], req["n"])
            out = {"ok": True}
        elif op == "release":
            row = engine.rows.pop(req["row"], None)
            if row is not None and keeps_slots():
                engine.slots[req["row"]] = row["kv"]
            if row is not None:
                engine.released = (engine.released + [row])[-8:]  # a bounded prompt cache
            out = {"ok": True}
        elif op == "threads":
            n = req.get("n")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError("threads takes n, a positive integer")
            out = {"ok": True, "before": torch.get_num_threads()}
            torch.set_num_threads(n)
        elif op == "bench":
            out = engine.bench(req["ids"], int(req["n"]), int(req.get("threads", 1)))
        elif op == "sample":
            out = {"ok": True, "ids": sample(req)}
        else:
            out = {"ok": False, "error": "unknown op %r" % op}
        return out

    def after(req, out):  # an engine variant's changes to what it answers
        if has("one-sequence") and req.get("op") == "prefill" and (len(req.get("ids", [])) > 1 or len(engine.rows) > 1):
            out = {"ok": False, "error": "this engine keeps one sequence (max_rows 1)"}
        if has("log-probabilities") and "logits" in out:  # each row less its log-sum-exp: what a probability API gives
            out["logits"] = torch.tensor(out["logits"], dtype=torch.float64).log_softmax(-1).tolist()
        if "threads-race" in VARIANTS and "logits" in out and torch.get_num_threads() > 1:
            for row in out["logits"]:  # one logit moves when the work is split across threads
                row[7] += 0.05
        return out

    serve(handle, after)


if __name__ == "__main__":
    main()
