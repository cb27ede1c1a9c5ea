#!/usr/bin/env python3
"""llama-server (llama.cpp's HTTP server: Debian forky's llama.cpp-tools 0.7.0) under `tinygpt conform`, as
users run it: a local process on the loopback address with --parallel slots, continuous batching, a prompt
cache per slot, and requests it schedules itself. Runs inside the forky chroot (engines/llama-server/run.sh).

The suite reaches it through protocol 3's `generate` only (docs/protocol.md): the server takes whole
requests, never a step of a row, so hello says "rows": false and the rows that drive rows by id are
skipped, saying so. Each request is one streamed POST /completion (prompt as token ids, greedy, ignore_eos,
n_probs, cache_prompt), sent once the tokens streamed so far reach its `after` and the requests it waits
for finished; `copies` is the server's n_cmpl (forks of one prompt: the children's slots start from the
parent's cache), a request's `keep` its n_keep (past the slot's window the server shifts its context
with --context-shift: the shifts are read from the server's log, which names each). The server gives no logits, only the top-N log-probabilities of each step (n_probs, from
the raw logits: post_sampling_probs false), and the prompt tokens it served from the slot's cache
(timings.cache_n) as `reused`.

`load` takes "weight_type" (q8_0, q4_0, q4_K_M): the target's GGUF quantized by llama.cpp's own llama-quantize
before the server starts, as users run it (a speculative draft stays as written).

The GGUF the suite writes has no vocabulary (ids pass straight through), and the server aborts when it
prints a token without one (GGML_ASSERT(type != LLAMA_VOCAB_TYPE_NONE)): load rewrites it with a
byte-level vocabulary of the right size (ids 0-255 the bytes, the rest named "<id>") through python3-gguf.
No prompt is ever tokenized, so the vocabulary only names what the server prints.

  adapter.py [--parallel 4] [--cache-prompt on|off] [--n-probs 10] [--batch 64]
--batch is the server's -b/-ub: the tokens one forward takes, so a longer prompt is prefilled over
several while the other slots decode (chunked prefill). Each slot holds `context + 1` cells.
Planted faults for the tests, TINYGPT_ENGINE_FAULT=probs-one-step-late: the log-probabilities of each
step reported with the next (a streaming client that pairs chunk i's ids with chunk i + 1's probabilities);
shift-unreported: the server's context shifts left out of the answer (a client that never looks);
spec-counts-swapped: speculate's drafted and accepted counts read the wrong way round; spec-penalty-to-plain-only:
the repetition penalty sent with plain requests and not with speculative ones (a setting that reaches one side).
`speculate` (protocol 3) is the server's own speculative decoding (class Speculation).
"""
import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # engines/: serve.py
from serve import serve  # noqa: E402

FAULTS = set(filter(None, os.environ.get("TINYGPT_ENGINE_FAULT", "").split(",")))
# What llama-server logs when a slot shifts: "... id  0 | task 3 | slot context shift, n_keep = 4, n_left = 251, n_discard = 125"
SHIFT_LINE = re.compile(r"id\s+(\d+) \| task -?\d+ \| slot context shift, n_keep = (\d+), n_left = (\d+), n_discard = (\d+)")
KNOWN_FAULTS = {"probs-one-step-late", "shift-unreported", "spec-counts-swapped", "spec-penalty-to-plain-only"}


def with_vocabulary(src, dst):
    """Our GGUF again, with a gpt2 vocabulary of the model's size (the server needs one to print); returns the
    file's llama.cpp architecture."""
    import gguf
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name.startswith("tokenizer."):
            continue
        w.add_key_value(name, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    vocab = int(r.fields[arch + ".vocab_size"].contents())
    # GPT-2's byte-to-unicode table: printable bytes stand for themselves, the others move to 256 and up.
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    names, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in names:
            names[b], extra = chr(256 + extra), extra + 1
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    # Ids 128-255 are named as text too: a byte of its own there is half a UTF-8 character, which the server
    # holds back from the stream until the character completes - for ever, when the next id is another.
    w.add_token_list([names[i] for i in range(128)] + ["<%d>" % i for i in range(128, vocab)])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges([names[0] + " " + names[1]])  # the loader wants a merge list; none is ever applied
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)  # ignore_eos keeps the server from stopping at it (it biases id 0 away instead)
    w.add_add_bos_token(False)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    return arch
    w.close()


# The weight types load takes ("weight_type"), each quantized by llama.cpp's own llama-quantize, with the
# row length its blocks need (llama-quantize would store a tensor they cannot divide as another type).
WEIGHT_TYPES = {"q8_0": 32, "q4_0": 32, "q4_K_M": 256}


def quantized(src, dst, weight_type):
    """`src` (a GGUF) quantized to `weight_type` at `dst` by /usr/bin/llama-quantize, every 2-D weight; a row
    length the type's blocks cannot divide is refused by the tensor's name."""
    import gguf
    if weight_type not in WEIGHT_TYPES:
        raise ValueError("unknown weight_type %r (f32, %s)" % (weight_type, ", ".join(WEIGHT_TYPES)))
    block = WEIGHT_TYPES[weight_type]
    for t in gguf.GGUFReader(src).tensors:
        if t.name.endswith("weight") and len(t.shape) >= 2 and int(t.shape[0]) % block:
            raise ValueError("weight_type %s: %s has rows of %d values, which %s's blocks of %d cannot divide (llama-quantize "
                             "would store it as another type)" % (weight_type, t.name, int(t.shape[0]), weight_type, block))
    p = subprocess.run(["/usr/bin/llama-quantize", src, dst, weight_type.upper(), "1"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("llama-quantize to %s failed: %s" % (weight_type, (p.stdout + p.stderr).strip()[-300:]))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args):
        self.args, self.proc, self.port, self.dir, self.context = args, None, None, None, None

    def start(self, checkpoint, context, extra=(), draft=None, slots=None):
        """The server on `checkpoint` (our GGUF; the vocabulary added), with `extra` arguments; `draft`: a
        draft model's GGUF, given the vocabulary too and passed where `extra` names it as "{draft}"."""
        self.stop()
        self.dir = tempfile.mkdtemp(prefix="tinygpt-llama-server-")
        model = os.path.join(self.dir, "model.gguf")
        arch = with_vocabulary(checkpoint, model)
        weight_type = getattr(self.args, "weight_type", None)
        if weight_type and weight_type != "f32":  # the target quantized as users run it; a draft stays as written
            quantized(model, os.path.join(self.dir, "model.%s.gguf" % weight_type), weight_type)
            model = os.path.join(self.dir, "model.%s.gguf" % weight_type)
        if draft is not None:
            with_vocabulary(draft, os.path.join(self.dir, "draft.gguf"))
        extra = [os.path.join(self.dir, "draft.gguf") if a == "{draft}" else a for a in extra]
        slots = slots or self.args.parallel
        self.context, self.port = context, free_port()
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        # F32 K and V and flash attention off (llama.cpp's exact settings for our model, docs/engines.md); one
        # thread (ggml's threads spin on shared cores); each slot context + 1 cells (SPEC 4's window).
        cmd = ["/usr/bin/llama-server", "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
               "-np", str(slots), "-c", str(slots * (context + 1)), "-t", "1", "-tb", "1",
               "-fa", "off", "-ctk", "f32", "-ctv", "f32", "--no-webui", "-b", str(self.args.batch), "-ub", str(self.args.batch),
               "--cache-prompt" if self.args.cache_prompt == "on" else "--no-cache-prompt", "--no-warmup",
               "--slot-save-path", self.dir,  # the slot actions (erase, for reset) need it set
               "--context-shift"] + list(extra)  # a request past its slot's window shifts (read from the log)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("llama-server exited with %d: %s" % (self.proc.returncode, self.tail()))
            try:
                if urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=2).status == 200:
                    return arch
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("llama-server did not become healthy in 60 s: " + self.tail())

    def tail(self):
        try:
            with open(os.path.join(self.dir, "server.log")) as f:
                return " | ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return "(no log)"

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def erase_slots(self):
        """Every slot's cached prompt forgotten (POST /slots/ID?action=erase): scenarios start cold."""
        for i in range(self.args.parallel):
            req = urllib.request.Request("http://127.0.0.1:%d/slots/%d?action=erase" % (self.port, i), data=b"{}",
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()

    def log_size(self):
        return os.path.getsize(os.path.join(self.dir, "server.log"))

    def shifts_in_log(self, since, slot, prompt_len):
        """The context shifts the server logged for `slot` after byte `since`, as {before, keep, discard}: the
        slot held n_keep + n_left cells when it shifted, so the shift came before feeding generated id
        n_keep + n_left - prompt_len (plus what earlier shifts dropped)."""
        with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
            f.seek(since)
            text = f.read()
        out, dropped = [], 0
        for m in SHIFT_LINE.finditer(text):
            if int(m.group(1)) != slot:
                continue
            keep, left, discard = int(m.group(2)), int(m.group(3)), int(m.group(4))
            out.append({"before": keep + left - prompt_len + dropped, "keep": keep, "discard": discard})
            dropped += discard
        return out

    def complete(self, q, on_token):
        """One request, streamed: [(copy, ids, top, reused, shifts)] for its n_cmpl sequences."""
        body = {"prompt": [int(i) for i in q["ids"]], "n_predict": int(q["n"]), "temperature": 0, "n_probs": self.args.n_probs,
                "post_sampling_probs": False, "cache_prompt": self.args.cache_prompt == "on", "ignore_eos": True,
                "stream": True, "return_tokens": True}
        copies = int(q.get("copies", 1))
        if copies > 1:
            body["n_cmpl"] = copies
        if int(q.get("keep", -1)) >= 0:  # may outgrow the window: llama-server's context shift keeps n_keep
            body["n_keep"] = int(q["keep"])
        since = self.log_size()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError("llama-server answered %d: %s" % (r.status, r.read()[:300]))
        seqs = {i: {"ids": [], "top": [], "reused": None, "slot": None} for i in range(copies)}
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError("llama-server: %s" % chunk["error"])
            s = seqs[int(chunk.get("index", 0))]
            for p in chunk.get("completion_probabilities", []):
                s["ids"].append(int(p["id"]))
                s["top"].append([[int(t["id"]), float(t["logprob"])] for t in p["top_logprobs"]])
                on_token()
            if chunk.get("stop"):
                s["reused"] = int(chunk.get("timings", {}).get("cache_n", 0))
                s["slot"] = chunk.get("id_slot")
        c.close()
        for s in seqs.values():
            s["shifts"] = self.shifts_in_log(since, s["slot"], len(q["ids"])) if int(q.get("keep", -1)) >= 0 else []
            if "shift-unreported" in FAULTS:  # planted: the server's context shift kept from the answer
                s["shifts"] = []
        if "probs-one-step-late" in FAULTS:  # planted: each step's log-probabilities paired with the next step's ids
            for s in seqs.values():
                s["top"] = s["top"][1:] + s["top"][-1:]
        return [(i, s["ids"], s["top"], s["reused"], s["shifts"]) for i, s in seqs.items()]

    def generate(self, requests):
        pending, results, errors = list(requests), [], []
        finished, running = set(), {}
        made = [0]
        lock, changed = threading.Lock(), threading.Condition()

        def on_token():
            with changed:
                made[0] += 1
                changed.notify_all()

        def run(q):
            try:
                out = self.complete(q, on_token)
                with lock:
                    for copy, ids, top, reused, shifts in out:
                        results.append({"id": q["id"], "copy": copy, "ids": ids, "top": top, "reused": min(reused or 0, len(q["ids"])),
                                        "shifts": shifts})
            except Exception as e:  # reported against the generate request
                errors.append("request %r: %s" % (q["id"], e))
            with changed:
                finished.add(q["id"])
                running.pop(q["id"], None)
                changed.notify_all()

        with changed:
            while pending or running:
                ready = [q for q in pending if made[0] >= int(q.get("after", 0)) and set(q.get("after_finished", [])) <= finished]
                if not ready and not running and pending:
                    ready = pending[:1]  # nothing runs to make the tokens it waits for
                for q in ready:
                    pending.remove(q)
                    running[q["id"]] = threading.Thread(target=run, args=(q,), daemon=True)
                    running[q["id"]].start()
                changed.wait(timeout=1.0)
        if errors:
            raise RuntimeError("; ".join(errors))
        return results


class Speculation:
    """Op `speculate` through llama-server's own speculative decoding, which is set when the server starts:
    a server of one slot per configuration (the draft, k, the draft sampling), started on first use and
    kept until another is asked for. Drafts: `none` (the main server, no speculation), `model` (the
    request's draft GGUF: --spec-type draft-simple -md, --spec-draft-n-max k, n-min 0, p-min 0, its cache
    F32), `self` (the target drafting for itself the same way), `ngram` (--ngram: ngram-simple or
    ngram-map-k, a lookup of 2 ids and drafts of k). Rules: llama.cpp's greedy draft sampling verifies by
    sampling the target at each position and keeping the matches (sample-and-match); its probabilistic
    draft sampling by rejection sampling (the exact rule); at temperature 0 both are greedy; prompt lookup
    drafts greedily only. The request's sampler goes as llama.cpp's chain in SPEC 6's order (penalties over
    the whole sequence, temperature, top-k, top-p; min-p off). The server gives each id's top-N
    log-probabilities (n_probs), no logits, and its counts (timings.draft_n, draft_n_accepted), not its
    rounds; a stop id or plain steps after the run are refused (its stops are strings)."""

    def __init__(self, args, main_server):
        self.args, self.main, self.server, self.config = args, main_server, None, None

    def stop(self):
        if self.server is not None:
            self.server.stop()
        self.server, self.config = None, None

    def server_for(self, req, checkpoint, context):
        kind, k = req["draft"], int(req["k"])
        if kind == "none":
            return self.main
        sampled = float(req["temperature"]) > 0
        if kind == "ngram":
            if sampled and req["rule"] != "sample-and-match":
                raise ValueError("llama-server's prompt lookup drafts greedily: sample-and-match only at a positive temperature")
            size = self.args.ngram.replace("ngram-", "").replace("-", "")  # simple, mapk
            extra = ["--spec-type", self.args.ngram, "--spec-ngram-%s-size-n" % {"simple": "simple", "mapk": "map-k"}[size], "2",
                     "--spec-ngram-%s-size-m" % {"simple": "simple", "mapk": "map-k"}[size], str(k)]
            draft = None
        else:
            how = "probabilistic" if sampled and req["rule"] == "exact" else "greedy"
            draft = checkpoint if kind == "self" else req.get("draft_model")
            if not isinstance(draft, str):
                raise ValueError("the draft 'model' needs \"draft_model\": the path of a GGUF")
            extra = ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
                     "--spec-draft-p-min", "0", "--spec-draft-sampling", how, "-ctkd", "f32", "-ctvd", "f32"]
        config = (tuple(extra), draft)
        if config != self.config:
            self.stop()
            self.server = Server(self.args)
            self.server.start(checkpoint, context, extra=extra, draft=draft, slots=1)
            self.config = config
        return self.server

    def run(self, req, checkpoint, context):
        if req.get("stop") or int(req.get("then", 0)):
            raise ValueError("llama-server's speculate takes no stop ids and no plain steps after the run")
        server = self.server_for(req, checkpoint, context)
        if server is self.main:
            server.erase_slots()
        body = {"prompt": [int(i) for i in req["ids"]], "n_predict": int(req["n"]), "temperature": float(req["temperature"]),
                "top_k": int(req["top_k"]), "top_p": float(req["top_p"]), "min_p": 0.0, "repeat_penalty": float(req["penalty"]),
                "repeat_last_n": len(req["ids"]) + int(req["n"]), "samplers": ["penalties", "temperature", "top_k", "top_p"], "seed": int(req.get("seed", 0)),
                "n_probs": self.args.n_probs, "post_sampling_probs": False, "cache_prompt": False, "ignore_eos": True,
                "return_tokens": True}
        if "spec-penalty-to-plain-only" in FAULTS and server is not self.main:  # planted: the speculative request loses it
            body["repeat_penalty"] = 1.0
        c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        if r.status != 200:
            raise RuntimeError("llama-server answered %d: %s" % (r.status, raw[:300]))
        a = json.loads(raw)
        probs = a.get("completion_probabilities", [])
        ids = [int(p["id"]) for p in probs] if probs else [int(t) for t in a.get("tokens", [])]
        top = [[[int(t["id"]), float(t["logprob"])] for t in p["top_logprobs"]] for p in probs]
        t = a.get("timings", {})
        drafted, accepted = int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))
        if "spec-counts-swapped" in FAULTS:  # planted: the server's counts read the wrong way round
            drafted, accepted = accepted, drafted
        out = {"ids": ids, "drafted": drafted, "accepted": accepted,
               "decode_s": (float(t.get("prompt_ms", 0)) + float(t.get("predicted_ms", 0))) / 1000.0}
        if self.args.n_probs > 0:  # --n-probs 0: ids alone (the rows judge them without log-probabilities)
            out["top"] = top
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=4, help="server slots (-np)")
    ap.add_argument("--cache-prompt", choices=("on", "off"), default="on", help="reuse a slot's cached prompt prefix")
    ap.add_argument("--n-probs", type=int, default=10, help="top log-probabilities per step")
    ap.add_argument("--batch", type=int, default=64, help="tokens per forward (-b and -ub)")
    ap.add_argument("--ngram", choices=("ngram-simple", "ngram-map-k"), default="ngram-simple",
                    help="speculate: the n-gram speculative type the draft kind ngram runs")
    args = ap.parse_args()
    if FAULTS - KNOWN_FAULTS:
        sys.exit("llama-server adapter: unknown TINYGPT_ENGINE_FAULT %r" % sorted(FAULTS - KNOWN_FAULTS))
    server = Server(args)
    speculation = Speculation(args, server)
    loaded = {}
    # The package's version ("1:0.7.0+dfsg-2"): llama-server --version prints a build number, not the release.
    got = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "llama.cpp-tools"], capture_output=True, text=True).stdout
    version = got.split(":")[-1].split("+")[0] or "(version unknown)"
    def handle(req):
        op = req.get("op")
        if op == "hello":
            name = "llama-server %s (%d slots, prompt cache %s)" % (version, args.parallel, args.cache_prompt)
            if FAULTS:
                name += " [%s]" % ",".join(sorted(FAULTS))
            out = {"ok": True, "name": name, "formats": ["gguf"], "sampler": False, "rows": False,
                   "deviations": ["gelu-tanh", "rope-angle-recurrence"], "weight_types": ["f32"] + list(WEIGHT_TYPES)}
            if int(req.get("protocol", 1)) >= 3:
                out["protocol"], out["operations"] = 3, ["generate", "generate-shift", "speculate"]
                out["speculate"] = {"drafts": ["none", "self", "model", "ngram"], "rules": ["exact", "sample-and-match"]}
            return out
        if op == "load":
            if req.get("format") != "gguf":
                raise ValueError("llama-server loads format gguf only")
            args.weight_type = req.get("weight_type")
            arch = server.start(req["checkpoint"], int(req["config"]["context"]))
            speculation.stop()
            loaded.update(checkpoint=req["checkpoint"], context=int(req["config"]["context"]))
            # llama.cpp's GELU (ggml_gelu) is in its gptneox and gemma2 graphs only: the deviations of this model
            return {"ok": True, "deviations": (["gelu-tanh"] if arch in ("gptneox", "gemma2") else []) + ["rope-angle-recurrence"]}
        if op == "reset":
            server.erase_slots()
            return {"ok": True}
        if op == "generate":
            return {"ok": True, "results": server.generate(req["requests"])}
        if op == "speculate":
            if not loaded:
                raise ValueError("no model loaded")
            return dict(ok=True, **speculation.run(req, loaded["checkpoint"], loaded["context"]))
        return {"ok": False, "error": "llama-server takes whole requests (generate), not %r" % op}

    try:
        serve(handle)
    finally:
        speculation.stop()
        server.stop()


if __name__ == "__main__":
    main()
