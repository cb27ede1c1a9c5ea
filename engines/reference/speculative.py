"""The example engine's own speculative decoding (op `speculate`, docs/protocol.md), written apart from
the library's: a drafter proposes up to k ids, the target checks all of them in one k + 1 token step
through the row's cache (each position sees its own window), a rule decides how many stay, and the
rejected entries are dropped again.

Rules: `exact` (a draft x drawn from q is accepted with probability min(1, p(x)/q(x)); at the first
rejection the id is drawn from max(0, p - q) normalised; a bonus id from p when all stand) and
`sample-and-match` (greedy drafts; the target samples each position with its own stream and the round
stops at the first sample that differs). p and q are the distributions after the whole sampler
pipeline (penalty over the ids so far, temperature, top-k, top-p); temperature 0 makes both one-hot.
Drafts: none (plain decoding through the same loop), self (the target's weights, a cache of their
own), model (a draft checkpoint the request names, format pt), ngram (prompt lookup) and replay (ids
the request gives).

The host engine hands in its forward pass, its sampler's score stages and its planted-fault test, so
this module carries no model of its own. Planted faults (the engine's TINYGPT_ENGINE_FAULT), each
named as the library's fault it mirrors where there is one:
  spec-rejected-entries-kept          a round's rejected drafts stay in the cache (no rollback)
  spec-bonus-from-last-draft-position the bonus id drawn from the last draft's row, not the row after it
  spec-accept-every-draft             every draft accepted
  spec-stop-not-ending                a stop id accepted inside a block does not end the output
  spec-residual-is-p                  after a rejection the id is drawn from p, not max(0, p - q)
  spec-answers-draft-ids              the answer carries each round's drafted ids, not the ids it emitted
                                      (an adapter reading the draft's list)
  spec-match-draws-from-draft-stream  sample-and-match draws the verify positions from the draft's
                                      stream, not the target's (a sampler setting sent to one side only)
  spec-accepts-near-tie               at temperature 0 a draft whose logit is within 1e-3 of the best
                                      is kept, under either rule (a greedy check by a tolerance: vLLM
                                      #41758's family)
"""
import time

import torch

FAULTS = {"spec-rejected-entries-kept", "spec-bonus-from-last-draft-position", "spec-accept-every-draft", "spec-stop-not-ending",
          "spec-residual-is-p", "spec-answers-draft-ids", "spec-match-draws-from-draft-stream", "spec-accepts-near-tie"}
NEAR_TIE = 1e-3  # spec-accepts-near-tie's tolerance
DRAFTS = ["none", "self", "model", "ngram", "replay"]
RULES = ["exact", "sample-and-match"]
DRAFT_SEED_MIX = 0x9E3779B97F4A7C15  # the draft's stream: the request's seed mixed, so the two streams differ


def uniform(g):
    return torch.rand(1, generator=g, dtype=torch.float64).item()


def draw(weights, u):
    """The first index whose cumulative weight exceeds u times the total (weights (V) >= 0)."""
    c = weights.cumsum(0)
    return min(int((c <= u * c[-1]).sum()), weights.shape[0] - 1)


class ModelDraft:
    """A model drafting: a row of its own, fed the committed ids it has not seen and one id per draft."""

    def __init__(self, host, model):
        self.host, self.model = host, model
        self.reset()

    def reset(self):
        layers, heads = len(self.model.blocks), self.model.blocks[0].attn.n_heads
        hd = self.model.c["d_model"] // heads
        self.row = {"kv": [[torch.zeros(1, heads, 0, hd), torch.zeros(1, heads, 0, hd)] for _ in range(layers)], "pos": 0, "ids": []}
        self.offset = None

    def drop(self, n):
        if n > 0:
            self.host.drop_entries(self.row, n)
            self.row["ids"] = self.row["ids"][:len(self.row["ids"]) - n]

    def feed(self, ids):
        out = self.host.forward(self.model, torch.tensor([ids], dtype=torch.long), self.row, self.row["pos"])
        self.row["pos"] += len(ids)
        self.row["ids"] += ids
        return out

    def propose(self, seq, k, settings, greedy, gen):
        """Up to k ids after `seq` and the distribution each was drawn from (k, V)."""
        if self.offset is None:
            self.offset = max(0, len(seq) - self.model.c["context"])
        committed = seq[self.offset:]
        same = 0
        while same < min(len(committed) - 1, len(self.row["ids"])) and committed[same] == self.row["ids"][same]:
            same += 1
        self.drop(len(self.row["ids"]) - same)
        logits = self.feed(committed[same:])
        ids, qs = [], []
        for i in range(k):
            q = self.host.probs(logits, seq + ids, (0.0,) + settings[1:] if greedy else settings)
            ids.append(int(q.argmax()) if greedy else draw(q, uniform(gen)))
            qs.append(q)
            if i + 1 < k:
                logits = self.feed([ids[-1]])
        return ids, qs


def ngram(seq, k, max_n=3, min_n=1):
    """Prompt lookup: the latest earlier place where the last n ids occur (n from max_n down), what followed."""
    L = len(seq)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        for start in range(L - n - 1, -1, -1):
            if seq[start:start + n] == seq[L - n:]:
                return seq[start + n:start + n + k][:k]
    return []


class Speculative:
    """Op `speculate` for an engine: `host` gives forward(model, ids (1, T), row, start, every=False),
    probs(logits (V), history, settings) -> (V) float64, new_row() and its `rows`, drop_entries(row, n),
    the target `model`, and load_draft(path) for a draft checkpoint. forget() after the target changes."""

    def __init__(self, host, has):
        self.host, self.has = host, has
        self.drafts = {}

    def forget(self):
        self.drafts = {}

    def drafter(self, req):
        """The request's model draft (self: the target's weights), kept between requests; None for the others."""
        kind = req["draft"]
        if kind not in ("self", "model"):
            return None
        key = "self" if kind == "self" else req.get("draft_model")
        if not isinstance(key, str):
            raise ValueError("the draft 'model' needs \"draft_model\": the path of a checkpoint in format pt")
        if key not in self.drafts:
            self.drafts[key] = ModelDraft(self.host, self.host.model if kind == "self" else self.host.load_draft(key))
        d = self.drafts[key]
        d.reset()
        return d

    @torch.no_grad()
    def run(self, req):
        host, has = self.host, self.has
        model = host.model
        if model is None:
            raise ValueError("no model loaded")
        V, ctx = model.c["vocab_size"], model.c["context"]
        prompt = [int(i) for i in req["ids"]]
        n, k, kind, rule = int(req["n"]), int(req["k"]), req["draft"], req["rule"]
        then = int(req.get("then", 0))
        stop = set(int(i) for i in req.get("stop", []))
        settings = (float(req["temperature"]), int(req["top_k"]), float(req["top_p"]), float(req["penalty"]))
        if not prompt or any(i < 0 or i >= V for i in prompt) or n < 1 or not 1 <= k <= 64 or then < 0:
            raise ValueError("speculate takes a prompt of ids in [0, vocab), n >= 1, k in 1..64 and then >= 0")
        if kind not in DRAFTS or rule not in RULES:
            raise ValueError("unknown draft %r or rule %r (drafts %s, rules %s)" % (kind, rule, DRAFTS, RULES))
        exact = rule == "exact"
        seed = int(req.get("seed", 0))
        target_gen = torch.Generator().manual_seed(seed)
        draft_gen = torch.Generator().manual_seed((seed ^ DRAFT_SEED_MIX) & ((1 << 63) - 1))
        draft = self.drafter(req)
        replay = [int(i) for i in req.get("replay", [])]
        shift, period = int(req.get("replay_shift", 0)), int(req.get("replay_period", 1))

        rid = host.new_row()
        row = host.rows[rid]
        t0 = time.perf_counter()
        try:
            window = prompt[-ctx:]
            if len(window) > 1:
                host.forward(model, torch.tensor([window[:-1]], dtype=torch.long), row, 0)
                row["pos"] = len(window) - 1
            newest, seq = window[-1], list(prompt)
            out = {"ids": [], "logits": [], "rounds": 0, "drafted": 0, "accepted": 0, "accepted_per_round": []}
            stopped = False
            while len(out["ids"]) < n and not stopped:
                # The round's drafts and the distribution each was drawn from (None: one-hot).
                qs = None
                if kind == "none":
                    drafts = []
                elif kind == "ngram":
                    drafts = ngram(seq, k)
                elif kind == "replay":
                    drafts = [(replay[j] + shift) % V if j % period == 0 else replay[j] for j in range(len(seq), min(len(replay), len(seq) + k))]
                else:
                    drafts, qs = draft.propose(seq, k, settings, not exact or settings[0] == 0, draft_gen)
                kk = len(drafts)
                L = host.forward(model, torch.tensor([[newest] + drafts], dtype=torch.long), row, row["pos"], every=True)  # (kk + 1, V)
                row["pos"] += kk + 1
                emitted, rows, j = [], [], 0
                for i, d in enumerate(drafts):
                    p = host.probs(L[i], seq + drafts[:i], settings)
                    if has("spec-accepts-near-tie") and settings[0] == 0 and L[i][d].item() >= L[i].max().item() - NEAR_TIE:
                        emitted.append(d), rows.append(i)
                        j += 1
                        continue
                    if exact:
                        q = qs[i] if qs is not None else torch.nn.functional.one_hot(torch.tensor(d), V).double()
                        if has("spec-accept-every-draft") or uniform(target_gen) * q[d].item() < p[d].item():
                            emitted.append(d), rows.append(i)
                            j += 1
                            continue
                        w = p if has("spec-residual-is-p") else (p - q).clamp(min=0)
                        emitted.append(draw(w if w.sum() > 0 else p, uniform(target_gen))), rows.append(i)
                        break
                    x = draw(p, uniform(draft_gen if has("spec-match-draws-from-draft-stream") else target_gen))
                    emitted.append(x), rows.append(i)
                    if x != d:
                        break
                    j += 1
                else:
                    b = kk - 1 if has("spec-bonus-from-last-draft-position") and kk > 0 else kk
                    emitted.append(draw(host.probs(L[b], seq + drafts, settings), uniform(target_gen))), rows.append(b)
                # The output ends at a stop id (included) and at the budget; the entries past the kept ids go.
                m = len(emitted)
                if not has("spec-stop-not-ending"):
                    m = next((i + 1 for i, e in enumerate(emitted) if e in stop), m)
                m = min(m, n - len(out["ids"]))
                stopped = emitted[m - 1] in stop
                drop = 0 if has("spec-rejected-entries-kept") else kk + 1 - m
                host.drop_entries(row, drop)
                answered = drafts[:m] + emitted[len(drafts):m] if has("spec-answers-draft-ids") else emitted[:m]
                out["ids"] += answered
                out["logits"] += [L[r].tolist() for r in rows[:m]]
                seq += emitted[:m]
                newest = emitted[m - 1]
                out["rounds"] += 1
                out["drafted"] += kk
                out["accepted"] += j
                out["accepted_per_round"].append(j)
            out["decode_s"] = time.perf_counter() - t0  # the engine's own time: prefill and rounds, not the answer's JSON
            out["then_ids"], out["then_logits"] = [], []
            for _ in range(then):
                logits = host.forward(model, torch.tensor([[newest]], dtype=torch.long), row, row["pos"])
                row["pos"] += 1
                newest = int(logits.argmax())
                out["then_ids"].append(newest)
                out["then_logits"].append(logits.tolist())
            return out
        finally:
            host.rows.pop(rid, None)
