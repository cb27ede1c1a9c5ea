#!/usr/bin/env python3
"""The series' benchmark loop (bench.py of Part 4) over our independent Python port of its model
(series_reference.py: the same ops - torch.cat per step, matmul attention with a masked softmax,
since Debian's torch 1.13 has no scaled_dot_product_attention). It times the seed's grid with the
same prompt, warm-up and tok/s definition as `tinygpt bench`, so ci/bench-vs-series.sh can put
both side by side from one sitting. Run with Debian's python3-torch:

  series_bench.py --threads 2 --batch 1,16 --tokens 64,256,1024 --json out.json
"""
import argparse
import json
import time

import torch

import series_reference as sr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--tokens", default="64,256,1024")
    ap.add_argument("--no-uncached", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kernels", action="store_true", help="count CUDA kernels of one cached decode step (batch 1)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    model = sr.GPT(sr.CFG).to(dev).eval()
    rows = []

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if a.kernels and dev.type == "cuda":
        with torch.no_grad():
            caches = [{} for _ in model.blocks]
            model(torch.randint(sr.CFG["vocab_size"], (1, 8), device=dev), caches, 0)
            tok = torch.ones(1, 1, dtype=torch.long, device=dev)
            model(tok, caches, 8)
            sync()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                model(tok, caches, 9)
                sync()
        n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                and not e.name.startswith(("Memcpy", "Memset")))
        print(f"series loop (our Python port): {n} CUDA kernels per cached decode step at batch 1", flush=True)
    for b in [int(x) for x in a.batch.split(",")]:
        prompt = torch.randint(sr.CFG["vocab_size"], (b, 8), device=dev)
        model.cached(prompt, 16)
        if not a.no_uncached:
            model.uncached(prompt, 16)
        for n in [int(x) for x in a.tokens.split(",")]:
            slow = 0.0
            if not a.no_uncached:
                sync()
                t0 = time.perf_counter()
                model.uncached(prompt, n)
                sync()
                slow = time.perf_counter() - t0
            sync()
            t0 = time.perf_counter()
            model.cached(prompt, n)
            sync()
            fast = time.perf_counter() - t0
            rows.append({"batch": b, "tokens": n, "uncached_tok_s": b * n / slow if slow else 0.0,
                         "cached_tok_s": b * n / fast, "speedup": slow / fast if slow else 0.0})
            print(f"series {b:>5} {n:>6} {rows[-1]['uncached_tok_s']:>15,.0f} {rows[-1]['cached_tok_s']:>12,.0f}", flush=True)
    doc = {"machine": {"threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(dev)}, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
