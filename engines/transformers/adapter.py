#!/usr/bin/env python3
"""Hugging Face transformers under `tinygpt conform`: our model as transformers' own GPTNeoXForCausalLM,
decoded through transformers' own cache objects, over the conform protocol (docs/protocol.md, protocol 2).
Runs inside the forky chroot (ci/forky.sh), started by engines/transformers/run.sh.

  adapter.py --cache dynamic   DynamicCache: never trims (past the window it attends to every key)
  adapter.py --cache sliding   a DynamicCache of DynamicSlidingWindowLayer(context + 1) layers: SPEC 4's
                               semantics (attend to up to context + 1 keys, keep context)
  adapter.py --cache static    StaticCache sized for the whole sequence (no trimming either)

dynamic and static declare the deviation `no-window` in hello (their semantics past the context are
transformers' own, on purpose: conform keeps the run inside the window and says so); --undeclared leaves
it out, as a user would who did not know (then window-reference fails at position 257 and --diagnose
names our twin of it: faults.txt's diagnosis column).

Each row is its own cache at batch 1 (one forward per row and step); `fork` deep-copies a row's cache,
`truncate` crops it (DynamicCache only: a sliding window cannot give back what it dropped, and
transformers 5.12's StaticCache layers have no `crop`, so truncate is not offered there), `extend` feeds a chunk in one forward, `save` is the row's cache
object serialized by torch.save (`restore` loads it into a new row). No context shift: transformers'
caches have no operation for one. The sampler is transformers' own logits processors (repetition
penalty, temperature, top-k, top-p) and torch.multinomial with the request's seed; with per-row settings
and seeds (row-sampling), a generator per row.
`generate` (protocol 3) runs requests through transformers' continuous batching (class Served: paged
attention, fp32, prefix sharing on or off by --prefix-sharing, --block-size, --num-blocks and a batch-token
budget, --max-batch-tokens, that splits long prompts), with the scores of every step captured.
Planted faults for the tests, TINYGPT_ENGINE_FAULT=...: `window-256` (a sliding window of context keys,
one too few), `positions-restart` (each step's position_ids from the row's cache length modulo the window),
`results-by-finish-order` (generate's answers matched to requests in the order they came back),
`sliding-cache-at-global-window` (a zoo member's sliding layers given the global window: context + 1 keys),
`spec-logits-one-step-late` (speculate's answer pairs each id with the next id's scores).
`speculate` (protocol 3) is transformers' assisted generation and prompt lookup (class Speculation).
"""
import argparse
import base64
import copy
import io
import json
import os
import sys
import time

import torch
import transformers
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, DynamicCache, GPTNeoXConfig, GPTNeoXForCausalLM, LogitsProcessorList,
                          RepetitionPenaltyLogitsProcessor, StaticCache, TemperatureLogitsWarper,
                          TopKLogitsWarper, TopPLogitsWarper)

FAULTS = set(filter(None, os.environ.get("TINYGPT_ENGINE_FAULT", "").split(",")))

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # engines/: serve.py
from serve import serve  # noqa: E402


def neox_state(ours, n_layers, n_heads, d):
    """Our state dict -> GPTNeoX's: the fused qkv regrouped per head ([q_h | k_h | v_h]), and the q and k
    rows of each head permuted from our interleaved RoPE pairs (2j, 2j+1) to rotate-half (j, j + hd/2)."""
    hd = d // n_heads
    perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])  # new j <- old 2j, new hd/2 + j <- old 2j + 1
    out = {"gpt_neox.embed_in.weight": ours["emb.weight"], "embed_out.weight": ours["emb.weight"],
           "gpt_neox.final_layer_norm.weight": ours["norm.weight"], "gpt_neox.final_layer_norm.bias": ours["norm.bias"]}
    for i in range(n_layers):
        p, q = "blocks.%d." % i, "gpt_neox.layers.%d." % i
        qkv = ours[p + "attn.qkv.weight"]  # (3d, d): [Q | K | V]
        Q, K, V = qkv[:d], qkv[d:2 * d], qkv[2 * d:]
        heads = []
        for h in range(n_heads):
            rows = slice(h * hd, (h + 1) * hd)
            heads += [Q[rows][perm], K[rows][perm], V[rows]]
        out[q + "attention.query_key_value.weight"] = torch.cat(heads, 0)
        out[q + "attention.dense.weight"] = ours[p + "attn.out.weight"]
        for a, b in (("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")):
            out[q + b + ".weight"], out[q + b + ".bias"] = ours[p + a + ".weight"], ours[p + a + ".bias"]
        for a, b in (("mlp.0", "mlp.dense_h_to_4h"), ("mlp.2", "mlp.dense_4h_to_h")):
            out[q + b + ".weight"], out[q + b + ".bias"] = ours[p + a + ".weight"], ours[p + a + ".bias"]
    return out


class Engine:
    def __init__(self, cache_kind):
        self.kind = cache_kind
        self.model = None
        self.hf_dir = None  # a zoo member's Hugging Face directory, when that is what was loaded
        self.rows = {}  # id -> {"cache", "pos"}
        self.next_id = 0

    def load(self, req):
        self.hf_dir = None
        if req.get("format") == "hf":  # a zoo member (SPEC 10) as a Hugging Face directory: transformers' own class
            model = AutoModelForCausalLM.from_pretrained(req["checkpoint"], attn_implementation="eager", dtype=torch.float32).eval()
            self.config, self.context, self.hf_dir = model.config, int(model.config.max_position_embeddings), req["checkpoint"]
            types = set(getattr(self.config, "layer_types", None) or [])
            if self.kind == "sliding" and {"sliding_attention", "full_attention"} <= types:
                raise ValueError("--cache sliding cannot give %s's full layers SPEC 4's window beside its sliding ones "
                                 "(transformers builds their mask from the first full layer's cache); run --cache dynamic"
                                 % type(model).__name__)
            if "sliding-cache-at-global-window" in FAULTS and getattr(self.config, "sliding_window", None):
                # planted: the sliding layers' window set to the global one (their cache and mask both trimmed at
                # the context, as a full layer's): the model attends past its window of w
                self.config.sliding_window = self.context + 1
            self.model = model
            self.reset()
            return
        if req.get("format") != "safetensors":
            raise ValueError("this engine loads formats safetensors and hf only")
        c = req["config"]
        self.context = int(c["context"])
        self.model = self.neox_from(load_file(req["checkpoint"]), c)
        self.config = self.model.config
        self.reset()

    @staticmethod
    def neox_from(ours, c):
        """Our state dict and its config (SPEC 1's keys) -> transformers' GPTNeoXForCausalLM (eager attention)."""
        d, layers, heads = int(c["d_model"]), int(c["n_layers"]), int(c["n_heads"])
        config = GPTNeoXConfig(vocab_size=int(c["vocab_size"]), hidden_size=d, num_hidden_layers=layers,
                               num_attention_heads=heads, intermediate_size=4 * d,
                               hidden_act="gelu", rotary_pct=1.0, rotary_emb_base=10000, layer_norm_eps=1e-5,
                               max_position_embeddings=4096, tie_word_embeddings=True, use_parallel_residual=False,
                               attention_bias=False)
        model = GPTNeoXForCausalLM(config).eval()
        missing, unexpected = model.load_state_dict(neox_state(ours, layers, heads, d), strict=False)
        missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq") and "masked_bias" not in m and m != "embed_out.weight"]
        if missing or unexpected:
            raise ValueError("weights do not map: missing %s, unexpected %s" % (missing[:4], unexpected[:4]))
        model.set_attn_implementation("eager")
        return model

    def reset(self):
        self.rows, self.next_id = {}, 0

    def new_cache(self):
        if self.kind == "dynamic":
            # With the model's config, transformers builds its own hybrid cache: a sliding layer of a Mistral or
            # Gemma 2 keeps its window (DynamicSlidingWindowLayer), a full one everything.
            return DynamicCache(config=self.config) if self.hf_dir else DynamicCache()
        if self.kind == "static":
            return StaticCache(config=self.config, max_cache_len=1024)
        from transformers.cache_utils import DynamicSlidingWindowLayer
        window = self.context if "window-256" in FAULTS else self.context + 1
        if self.hf_dir:
            # transformers' own hybrid cache for the model (its sliding layers as it builds them), with each
            # full layer given SPEC 4's window (context + 1 keys) in place of keeping everything. A model with
            # both kinds (Gemma 2) builds its full layers' mask from the first full layer's cache: a window
            # object there gives a 64-key mask for 65 keys, so that mix is refused at load.
            cache = DynamicCache(config=self.config)
            cache.layers = [layer if isinstance(layer, DynamicSlidingWindowLayer) else DynamicSlidingWindowLayer(sliding_window=window)
                            for layer in cache.layers]
            return cache
        cache = DynamicCache()
        cache.layers = [DynamicSlidingWindowLayer(sliding_window=window) for _ in range(self.config.num_hidden_layers)]
        return cache

    @torch.no_grad()
    def feed(self, row, ids):
        """ids (T) at the row's next positions through its cache -> (V) logits of the last."""
        n = len(ids)
        pos = torch.arange(row["pos"], row["pos"] + n).unsqueeze(0)
        if "positions-restart" in FAULTS and n == 1:
            pos = pos % self.context
        out = self.model(input_ids=torch.tensor([ids]), position_ids=pos, past_key_values=row["cache"], use_cache=True,
                         cache_position=torch.arange(row["pos"], row["pos"] + n) if self.kind == "static" else None)
        row["cache"] = out.past_key_values
        row["pos"] += n
        return out.logits[0, -1].float()

    def add_rows(self, prompts):
        made, logits = [], []
        for ids in prompts:
            ids = [int(i) for i in ids][-self.context:]
            row = {"cache": self.new_cache(), "pos": 0}
            logits.append(self.feed(row, ids).tolist())
            self.rows[self.next_id] = row
            made.append(self.next_id)
            self.next_id += 1
        return logits, made

    def step_rows(self, rows, ids):
        return [self.feed(self.rows[r], [int(i)]).tolist() for r, i in zip(rows, ids)]

    def fork(self, rid):
        self.rows[self.next_id] = copy.deepcopy(self.rows[rid])
        self.next_id += 1
        return self.next_id - 1

    def extend(self, rid, ids):
        if rid not in self.rows or not ids:
            raise ValueError("row %r is not live, or no ids" % rid)
        return self.feed(self.rows[rid], [int(i) for i in ids]).tolist()

    def save(self, rid):
        buf = io.BytesIO()
        torch.save(self.rows[rid], buf)  # the row's cache object and position, as transformers keeps them
        return base64.b64encode(buf.getvalue()).decode()

    def restore(self, state):
        row = torch.load(io.BytesIO(base64.b64decode(state)), weights_only=False)  # our own save's bytes
        self.rows[self.next_id] = row
        self.next_id += 1
        return self.next_id - 1

    def truncate(self, rid, n):
        row = self.rows[rid]
        if self.kind == "sliding" or n < 0 or n > row["pos"]:
            raise ValueError("truncate: not offered for this cache or n out of range")
        row["cache"].crop(row["pos"] - n)
        row["pos"] -= n


class Speculation:
    """Op `speculate` through transformers' own assisted generation: `generate` with `assistant_model=`
    (a draft model, or the target's own weights: draft kinds model and self) or `prompt_lookup_num_tokens=`
    (prompt lookup: ngram), greedy or sampled, the target's own cache object (the engine's --cache kind)
    and its logits processors; `none` is plain `generate` with the same settings and seed. Draft length k
    is held constant (num_assistant_tokens = k, schedule constant, confidence threshold 0: transformers
    would otherwise stop drafting early). transformers decides the rule by the draft: a model's drafts are
    judged by speculative sampling (the exact rule), prompt lookup's by sampling every position and
    keeping the matches (sample-and-match); a request that asks otherwise at a positive temperature is
    refused. The acceptance counts are read from the candidate generator transformers builds (its
    update_candidate_strategy gets each round's matches)."""

    def __init__(self, engine):
        self.engine, self.drafts = engine, {}
        from transformers.generation import utils
        mixin = utils.GenerationMixin
        if not getattr(mixin, "_tinygpt_counted", False):
            make = mixin._get_candidate_generator

            def counted(model_self, *a, **kw):
                gen = make(model_self, *a, **kw)
                run = getattr(model_self, "_tinygpt_counts", None)
                if run is not None:
                    propose, update = gen.get_candidates, gen.update_candidate_strategy

                    def get_candidates(input_ids, *x, **y):
                        out = propose(input_ids, *x, **y)
                        run["last"] = int(out[0].shape[1] - input_ids.shape[1])
                        return out

                    def update_candidate_strategy(input_ids, scores, num_matches, *x, **y):
                        run["rounds"] += 1
                        run["drafted"] += run["last"]
                        run["per_round"].append(int(num_matches))
                        return update(input_ids, scores, num_matches, *x, **y)
                    gen.get_candidates, gen.update_candidate_strategy = get_candidates, update_candidate_strategy
                return gen
            mixin._get_candidate_generator, mixin._tinygpt_counted = counted, True

    def draft_model(self, path):
        if path not in self.drafts:
            if os.path.isdir(path):
                d = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()
            else:  # a safetensors file as the suite writes it: the config in its metadata
                from safetensors import safe_open
                with safe_open(path, framework="pt") as f:
                    config = json.loads(f.metadata()["config"])
                d = self.engine.neox_from(load_file(path), config)
            self.drafts[path] = d
        return self.drafts[path]

    @torch.no_grad()
    def run(self, req):
        e = self.engine
        if e.model is None:
            raise ValueError("no model loaded")
        prompt = [int(i) for i in req["ids"]][-e.context:]
        n, k, kind, rule = int(req["n"]), int(req["k"]), req["draft"], req["rule"]
        t, top_k, top_p, penalty = settings_of(req)
        if kind not in ("none", "self", "model", "ngram"):
            raise ValueError("transformers drafts with none, self, model and ngram only (not %r)" % kind)
        own_rule = "exact" if kind in ("self", "model") else "sample-and-match"
        if t > 0 and rule != own_rule:
            raise ValueError("transformers judges %s drafts by %s, not %s" % (kind, own_rule, rule))
        stop = [int(i) for i in req.get("stop", [])]
        kw = dict(max_new_tokens=n, do_sample=t > 0, temperature=t if t > 0 else None, top_k=top_k, top_p=top_p,
                  repetition_penalty=penalty, output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                  eos_token_id=stop, past_key_values=e.new_cache())
        if kind in ("self", "model"):
            draft = copy.deepcopy(e.model) if kind == "self" else self.draft_model(req["draft_model"])
            draft.generation_config.num_assistant_tokens = k
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            kw["assistant_model"] = draft
        elif kind == "ngram":
            kw["prompt_lookup_num_tokens"] = k
            kw["max_matching_ngram_size"] = 3
        counts = {"rounds": 0, "drafted": 0, "per_round": [], "last": 0}
        e.model._tinygpt_counts = counts
        torch.manual_seed(int(req.get("seed", 0)))
        t0 = time.perf_counter()
        try:
            out = e.model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), **kw)
        finally:
            e.model._tinygpt_counts = None
        elapsed = time.perf_counter() - t0  # generate's own time, not the answer's JSON
        ids = [int(i) for i in out.sequences[0, len(prompt):]]
        logits = [x[0].float().tolist() for x in out.logits][:len(ids)]
        if "spec-logits-one-step-late" in FAULTS:  # planted: each id paired with the next step's scores
            logits = logits[1:] + logits[-1:]
        if kind in ("none",):
            counts["rounds"], counts["per_round"] = len(ids), [0] * len(ids)
        answer = {"ids": ids, "logits": logits, "decode_s": elapsed, "rounds": counts["rounds"], "drafted": counts["drafted"],
                  "accepted": sum(counts["per_round"]), "accepted_per_round": counts["per_round"], "then_ids": [], "then_logits": []}
        then = int(req.get("then", 0))
        if then:  # plain greedy steps on the cache generate left (it holds every id but the newest)
            row = {"cache": out.past_key_values, "pos": len(prompt) + len(ids) - 1}
            last = ids[-1]
            for _ in range(then):
                x = e.feed(row, [last])
                last = int(x.argmax())
                answer["then_ids"].append(last)
                answer["then_logits"].append(x.tolist())
        return answer


class Served:
    """transformers' continuous batching (ContinuousBatchingManager: paged attention over a block table,
    fp32, a FIFO scheduler, prefix sharing of computed blocks, chunked prefill under a batch-token budget,
    forks through num_return_sequences) behind op `generate`. The library returns no per-step logits: the
    model runner's `_sample` is wrapped (at class level, before the manager's thread starts) to keep, per
    request and generated index, the scores each token is chosen from (greedy: the raw logits), and the
    cache's prefix search to keep how many prompt tokens each request reused. A request arrives once
    `after` tokens were made (counted in the same hook) and its `after_finished` requests came back."""

    current = None  # the run the class-level hooks report to

    def __init__(self, engine, prefix_sharing, block_size, num_blocks, max_batch_tokens):
        from transformers.generation.continuous_batching import cache, model_runner
        self.engine, self.prefix_sharing = engine, prefix_sharing
        self.block_size, self.num_blocks, self.max_batch_tokens = block_size, num_blocks, max_batch_tokens
        self.scores, self.reused, self.made, self.evictions = {}, {}, 0, 0
        self._model = None
        runner, paged = model_runner.ModelRunner, cache.PagedAttentionCache
        if not getattr(runner, "_tinygpt_wrapped", False):
            sample, search = runner._sample, paged.search_prefix_match

            def keep(runner_self, scores, output_ids):
                run = Served.current
                if run is not None:
                    live = [f for f in runner_self.inputs_and_outputs.requests_in_batch if f.has_new_token]
                    for j, f in enumerate(live):  # scores row j is the j-th request that gets a token
                        st = f.state
                        # The index of the token being chosen among the request's own: a request evicted and
                        # soft-reset carries what it generated in its prompt (_true_initial_tokens: the prompt's own length).
                        prompt = st._true_initial_tokens or len(st.initial_tokens)
                        index = len(st.initial_tokens) + len(st.generated_tokens) - prompt
                        run.scores.setdefault(st.request_id, {})[index] = scores[0, j].float().clone()
                        run.made += 1
                sample(runner_self, scores, output_ids)

            def searched(cache_self, request_id, prompt_ids):
                n = search(cache_self, request_id, prompt_ids)
                if Served.current is not None:
                    Served.current.reused[request_id] = Served.current.reused.get(request_id, 0) + n
                return n
            from transformers.generation.continuous_batching import offloading_manager
            offload = offloading_manager.OffloadingManager.offload_one_request

            def evicted(manager_self):  # the cache is full: a request is soft-reset (on CPU nothing is offloaded)
                if Served.current is not None:
                    Served.current.evictions += 1
                return offload(manager_self)
            offloading_manager.OffloadingManager.offload_one_request = evicted
            runner._sample, paged.search_prefix_match, runner._tinygpt_wrapped = keep, searched, True

    def model(self):
        """A model of its own (the manager switches its attention to paged), with the engine's weights."""
        if self._model is None:
            m = type(self.engine.model)(self.engine.config).eval()  # GPTNeoXForCausalLM, or a zoo member's own class
            m.load_state_dict(self.engine.model.state_dict())
            m.set_attn_implementation("eager")
            self._model = m
        return self._model

    @torch.no_grad()
    def run(self, requests, timeout=300.0):
        from transformers import ContinuousBatchingConfig, GenerationConfig
        self.scores, self.reused, self.made, self.evictions = {}, {}, 0, 0
        copies = max(int(q.get("copies", 1)) for q in requests)
        gc = GenerationConfig(do_sample=False, max_new_tokens=max(int(q["n"]) for q in requests), eos_token_id=None, pad_token_id=0)
        gc.num_return_sequences = copies  # greedy children: set after validation, which refuses it in the constructor
        cb = ContinuousBatchingConfig(block_size=self.block_size, num_blocks=self.num_blocks, max_batch_tokens=self.max_batch_tokens,
                                      allow_block_sharing=self.prefix_sharing, scheduler_type="fifo", use_cuda_graph=False,
                                      use_async_batching=False)
        mgr = self.model().init_continuous_batching(generation_config=gc, continuous_batching_config=cb)
        Served.current = self
        got = {}  # sequence key -> GenerationOutput, in the order they came back
        try:
            mgr.start()
            pending, outstanding, finished = list(requests), set(), set()
            expected, deadline = len(requests) * copies, time.time() + timeout

            def submit(q):
                mgr.add_request([int(i) for i in q["ids"]], request_id="r%d" % q["id"], max_new_tokens=int(q["n"]))
                outstanding.add(q["id"])
                pending.remove(q)
            while len(got) < expected:
                if time.time() > deadline:
                    raise RuntimeError("continuous batching returned %d of %d sequences in %.0f s" % (len(got), expected, timeout))
                for q in [q for q in pending if self.made >= int(q.get("after", 0)) and set(q.get("after_finished", [])) <= finished]:
                    submit(q)
                if pending and not outstanding:  # nothing runs to make the tokens the next one waits for
                    submit(pending[0])
                out = mgr.get_result(timeout=0.02)
                if out is None:
                    if mgr.fatal_error is not None:
                        raise RuntimeError("continuous batching failed: %s" % mgr.fatal_error)
                    continue
                if getattr(out, "error", None):
                    raise RuntimeError("request %s failed: %s" % (out.request_id, out.error))
                got[out.request_id] = out
                parent = out.request_id.split("__child#")[0]
                if all(k in got for k in [parent] + ["%s__child#%d" % (parent, i) for i in range(copies - 1)]):
                    outstanding.discard(int(parent[1:]))
                    finished.add(int(parent[1:]))
        finally:
            mgr.stop(block=True)
            Served.current = None
        if self.evictions:
            sys.stderr.write("transformers adapter: %d request(s) evicted and soft-reset under cache pressure\n" % self.evictions)
        results = []
        for q in requests:
            rid, n = "r%d" % q["id"], int(q["n"])
            for c in range(int(q.get("copies", 1))):  # children a request did not ask for are dropped
                key = rid if c == 0 else "%s__child#%d" % (rid, c - 1)
                own, parent = self.scores.get(key, {}), self.scores.get(rid, {})
                steps = [own.get(i, parent.get(i)) for i in range(n)]  # a child's first tokens were its parent's
                ids = [int(t) for t in got[key].generated_tokens]
                if any(x is None for x in steps) or len(ids) != n:
                    raise RuntimeError("sequence %s: %d ids, scores for %d of %d steps" % (key, len(ids), sum(x is not None for x in steps), n))
                results.append({"id": q["id"], "copy": c, "ids": ids, "logits": [x.tolist() for x in steps],
                                "reused": min(self.reused.get(key, 0), len(q["ids"])), "key": key})
        if "results-by-finish-order" in FAULTS:  # planted: answers matched to requests in the order they came back
            came = {r["key"]: r for r in results}
            sources = [(came[k]["ids"], came[k]["logits"]) for k in got if k in came]
            for r, (ids, logits) in zip(results, sources):
                r["ids"], r["logits"] = ids, logits
        for r in results:
            del r["key"]
        return results


def processed(x, hist, t, k, p, r):
    """One row's scores x (1, V) through transformers' own processors in the suite's order: repetition
    penalty, temperature, top-k, top-p. At temperature 0 only the penalty: the argmax is the pick."""
    V = x.shape[1]
    h = torch.tensor([hist], dtype=torch.long) if hist else None
    if r != 1.0 and h is not None:  # the penalty reads the history; an empty one leaves the scores alone
        x = RepetitionPenaltyLogitsProcessor(r)(h, x)
    if t == 0:
        return x
    procs = [TemperatureLogitsWarper(t)]
    if 0 < k < V:
        procs.append(TopKLogitsWarper(k))
    if p < 1.0:
        procs.append(TopPLogitsWarper(p))
    ids = h if h is not None else torch.zeros((1, 0), dtype=torch.long)
    for proc in procs:
        x = proc(ids, x)
    return x


def settings_of(d):
    return float(d["temperature"]), int(d["top_k"]), float(d["top_p"]), float(d["penalty"])


def sample(req):
    """transformers' processors and torch.multinomial. Without "rows": one setting and one generator seeded
    once for the batch; with "rows" (row-sampling): each row its own settings and its own generator (a
    request's own seed, as generate() takes one per call; none: fresh entropy)."""
    x = torch.tensor([[float(v) for v in row] for row in req["logits"]], dtype=torch.float32)  # (B, V)
    B = x.shape[0]
    hist = req.get("history") or [[] for _ in range(B)]
    n = int(req["n"])
    if "rows" not in req:
        t, k, p, r = settings_of(req)
        y = torch.cat([processed(x[b:b + 1], hist[b], t, k, p, r) for b in range(B)])
        if t == 0:
            return y.argmax(-1, keepdim=True).repeat(1, n).tolist()
        g = torch.Generator().manual_seed(int(req["seed"]))
        return torch.multinomial(y.softmax(-1), n, replacement=True, generator=g).tolist()
    if len(req["rows"]) != B:
        raise ValueError("%d row settings for %d rows" % (len(req["rows"]), B))
    out = []
    for b, row in enumerate(req["rows"]):
        t, k, p, r = settings_of(row)
        y = processed(x[b:b + 1], hist[b], t, k, p, r)
        if t == 0:
            out.append([int(y[0].argmax())] * n)
            continue
        g = torch.Generator()
        if row.get("seed") is None:
            g.seed()
        else:
            g.manual_seed(int(row["seed"]))
        out.append(torch.multinomial(y.softmax(-1), n, replacement=True, generator=g)[0].tolist())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", choices=("dynamic", "sliding", "static"), default="sliding")
    ap.add_argument("--prefix-sharing", choices=("on", "off"), default="on",
                    help="generate: continuous batching's block sharing between requests (allow_block_sharing)")
    ap.add_argument("--block-size", type=int, default=16, help="generate: tokens per KV cache block")
    ap.add_argument("--num-blocks", type=int, default=64, help="generate: blocks in the paged cache")
    ap.add_argument("--max-batch-tokens", type=int, default=48,
                    help="generate: tokens per forward (a longer prompt is prefilled in chunks over several)")
    ap.add_argument("--drafts", default="none,self,model,ngram",
                    help="speculate: the draft kinds hello offers (none, self, model: assisted generation; ngram: prompt lookup)")
    ap.add_argument("--undeclared", action="store_true",
                    help="dynamic, static: leave the deviation no-window out of hello (judged past the window as SPEC 4)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = Engine(args.cache)
    served = Served(engine, args.prefix_sharing == "on", args.block_size, args.num_blocks, args.max_batch_tokens)
    speculation = Speculation(engine)
    drafts = [d for d in args.drafts.split(",") if d]
    if set(drafts) - {"none", "self", "model", "ngram"}:
        ap.error("--drafts takes none, self, model and ngram")
    ops = ["ragged", "join", "fork", "release", "threads", "row-sampling"] + (["truncate"] if args.cache == "dynamic" else [])
    # transformers refuses assisted generation on a StaticCache ("assisted generate is not supported with
    # Static cache classes"): that set-up offers no speculate, and the speculative rows say so.
    ops3 = ops + ["extend", "save", "restore", "generate"] + (["speculate"] if args.cache != "static" else [])
    spoken = 1

    def handle(req):
        nonlocal spoken
        op = req.get("op")
        if op == "hello":
            name = "transformers %s (%s; generate: continuous batching, prefix sharing %s)" % (
                transformers.__version__, {"dynamic": "DynamicCache", "static": "StaticCache", "sliding": "DynamicSlidingWindowLayer"}[args.cache],
                args.prefix_sharing)
            if FAULTS:
                name += " [%s]" % ",".join(sorted(FAULTS))
            out = {"ok": True, "name": name, "formats": ["safetensors", "hf"], "sampler": True}
            if args.cache != "sliding" and not args.undeclared:
                out["deviations"] = ["no-window"]  # never trims: what it does past the context is its own
            spoken = min(3, int(req.get("protocol", 1)))
            if spoken >= 2:
                out["protocol"] = spoken
                out["operations"] = ops3 if spoken >= 3 else ops
            if spoken >= 3 and "speculate" in ops3:  # assisted generation (a draft model, or the target's weights) and prompt lookup
                out["speculate"] = {"drafts": drafts, "rules": ["exact", "sample-and-match"]}
        elif op == "load":
            engine.load(req)
            served._model = None  # continuous batching's own copy is made again from these weights
            out = {"ok": True}
        elif op == "reset":
            engine.reset()
            out = {"ok": True}
        elif op == "prefill":
            logits, made = engine.add_rows(req["ids"])
            out = {"ok": True, "logits": logits, "rows": made}
        elif op == "step":
            rows = req.get("rows", sorted(engine.rows))
            out = {"ok": True, "logits": engine.step_rows(rows, [i[0] if isinstance(i, list) else i for i in req["ids"]])}
        elif op == "fork":
            out = {"ok": True, "row": engine.fork(req["row"])}
        elif op == "extend" and spoken >= 3:
            out = {"ok": True, "logits": [engine.extend(req["row"], req["ids"])]}
        elif op == "save" and spoken >= 3:
            out = {"ok": True, "state": engine.save(req["row"])}
        elif op == "restore" and spoken >= 3:
            out = {"ok": True, "row": engine.restore(req["state"])}
        elif op == "generate" and spoken >= 3:
            out = {"ok": True, "results": served.run(req["requests"])}
        elif op == "speculate" and spoken >= 3:
            if req.get("draft") not in drafts:
                raise ValueError("this adapter drafts with %s only (--drafts)" % drafts)
            out = dict(ok=True, **speculation.run(req))
        elif op == "truncate" and "truncate" in ops:
            engine.truncate(req["row"], req["n"])
            out = {"ok": True}
        elif op == "release":
            engine.rows.pop(req["row"], None)
            out = {"ok": True}
        elif op == "threads":
            out = {"ok": True, "before": torch.get_num_threads()}
            torch.set_num_threads(int(req["n"]))
        elif op == "sample":
            out = {"ok": True, "ids": sample(req)}
        else:
            out = {"ok": False, "error": "unknown op %r" % op}
        return out

    serve(handle)


if __name__ == "__main__":
    main()
