#!/usr/bin/env python3
"""A repeated request, its prefix the second time from the engine's prompt cache (llama.cpp #28527's
shape: a request whose first answer changed once its prefix came from the cache, on Q4_0 only), through
the llama.cpp adapter at each weight type. For each type: prefill the fixture's own greedy text
(PROMPT ids), decode N greedy steps; release the row; send the same prompt again - the adapter serves
all but its last token from the released row's cells, as llama-server's prompt cache does - and decode
again. Reports, per type, how far the second answer's logits are from the first's (the prompt's last
position and every decoded step) and whether the greedy ids part; then the same prompt with the cache
cleared between (both computed whole), to tell the cache from run-to-run noise; and the prompt's cells
written one token at a time (a 3-token prefill, then steps), which is what the `self` row compares, and
the prompt sent again with its prefix served from those cells (a conversation's next turn, whose prompt
holds what the engine generated).
Usage: quantized_prefix_hit.py TINYGPT ENGINE WORK_DIR [--types f32,q8_0,q4_0,q4_K_M] [--prompt 200] [--steps 40]
Asserts: at f32 a prefix hit changes no logit by more than 5e-4 (llama.cpp's declared self bound); at every type a prompt computed whole
twice gives identical logits (the engine is deterministic, so a difference is the cache's); writes
WORK_DIR/prefix_hit.json. Exit 0 when those hold (a quantized type's prefix-hit difference is a
measurement, reported, not asserted), 1 otherwise, 77 when the engine is not built."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "engines"))
from adapter_client import member_engine  # noqa: E402


def argmax(v):
    return max(range(len(v)), key=v.__getitem__)


def answer(call, prompt, steps):
    """(reused, [logits of the prompt's last position, then of each decoded step], ids)."""
    a = call({"op": "prefill", "ids": [prompt]})
    row, logits = a["rows"][0], [a["logits"][0]]
    reused = (a.get("reused") or [0])[0]
    ids = []
    for _ in range(steps):
        ids.append(argmax(logits[-1]))
        logits.append(call({"op": "step", "rows": [row], "ids": [[ids[-1]]]})["logits"][0])
    call({"op": "release", "row": row})
    return reused, logits, ids


def stepwise(call, prompt):
    """The prompt's last logits with its cells written one token at a time (a 3-token prefill, then steps)."""
    a = call({"op": "prefill", "ids": [prompt[:3]]})
    row, logits = a["rows"][0], a["logits"][0]
    for t in prompt[3:]:
        logits = call({"op": "step", "rows": [row], "ids": [[t]]})["logits"][0]
    call({"op": "release", "row": row})
    return logits


def parting(a, b):
    """The first step whose greedy ids differ, or None."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def worst(a, b):
    return max(max(abs(x - y) for x, y in zip(u, v)) for u, v in zip(a, b))


def main():
    args = sys.argv[1:]
    tinygpt, engine, work = args[0], args[1], args[2]
    opts = dict(zip(args[3::2], args[4::2]))
    types = opts.get("--types", "f32,q8_0,q4_0,q4_K_M").split(",")
    n_prompt, steps = int(opts.get("--prompt", "200")), int(opts.get("--steps", "40"))
    if not os.access(engine.split()[0], os.X_OK):
        print("skipped: %s is not built (ci/engines.sh builds it)" % engine)
        return 77
    os.makedirs(work, exist_ok=True)
    golden = json.load(open(os.path.join(ROOT, "golden", "greedy_600.json")))
    prompt = golden["rows"][0]["ids"][:n_prompt]
    results, problems = [], []
    for t in types:
        with member_engine(tinygpt, engine, "fixture", **({} if t == "f32" else {"weight_type": t})) as call:
            call({"op": "reset"})
            _, first, first_ids = answer(call, prompt, steps)
            reused, hit, hit_ids = answer(call, prompt, steps)  # the prefix from the released row's cells
            call({"op": "reset"})                               # the cache cleared: computed whole again
            _, again, again_ids = answer(call, prompt, steps)
            call({"op": "reset"})                               # the same prompt's cells written a token at a time
            by_steps = stepwise(call, prompt)
            # The same prompt again, its prefix now served from those cells (a conversation's next turn: the
            # prompt holds the tokens the engine generated last turn, their cells written a token at a time).
            reused_gen, gen_hit, gen_ids = answer(call, prompt, steps)
        part = parting(first_ids, hit_ids)
        r = {"weight_type": t, "reused": reused, "prompt_diff": worst(first[:1], hit[:1]), "steps_diff": worst(first, hit),
             "ids_part_at_step": part, "whole_twice_diff": worst(first, again), "whole_twice_ids_equal": first_ids == again_ids,
             "stepwise_diff": worst(first[:1], [by_steps]), "generated_hit_reused": reused_gen,
             "generated_hit_diff": worst(first, gen_hit),
             "generated_hit_ids_part_at_step": parting(first_ids, gen_ids)}
        results.append(r)
        print("%-7s reused %d of %d: the prompt's last logits %.2e apart, the %d steps %.2e, greedy ids %s; computed whole twice: %.2e; "
              "its cells written a token at a time: %.2e, a hit on those cells: %.2e over the %d steps, greedy ids %s"
              % (t, reused, len(prompt), r["prompt_diff"], steps, r["steps_diff"], "equal" if part is None else "part at step %d" % part,
                 r["whole_twice_diff"], r["stepwise_diff"], r["generated_hit_diff"], steps,
                 "equal" if r["generated_hit_ids_part_at_step"] is None else "part at step %d" % r["generated_hit_ids_part_at_step"]))
        if r["whole_twice_diff"] != 0:
            problems.append("%s: the same prompt computed whole twice differs by %.2e" % (t, r["whole_twice_diff"]))
        # At f32 llama.cpp's own batch-shape noise (its fp16 GELU table) stays within the self bound it
        # declares for it, 5e-4.
        if t == "f32" and max(r["steps_diff"], r["stepwise_diff"], r["generated_hit_diff"]) > 5e-4:
            problems.append("f32: a prefix hit or a token-at-a-time prefix moved the logits by more than 5e-4: %r" % r)
        if reused == 0:
            problems.append("%s: the second request reused nothing (the adapter's prompt cache did not serve it)" % t)
    json.dump(results, open(os.path.join(work, "prefix_hit.json"), "w"), indent=1)
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
