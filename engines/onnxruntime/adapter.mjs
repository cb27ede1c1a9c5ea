#!/usr/bin/env node
// ONNX Runtime under `tinygpt conform` (docs/protocol.md): onnxruntime-node runs the graph that
// export_onnx.py makes of our model (one graph for prefill and decode: ids, start, past K/V in; the
// last position's logits and present K/V out). The adapter keeps the cache the way SPEC 4 says: the
// positions it passes keep growing, and after each call it keeps the last `context` entries. It has
// no sampler: the sampler rows are skipped, saying so. Node rather than C++: the npm package carries
// the runtime and its Node binding but no C headers.
//
// Planted faults for the suite's tests (TINYGPT_ENGINE_FAULT): positions-restart (every call starts
// at position 0: the seed's first bug), never-trimmed (the cache keeps every entry).
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { lastEntries, serve } from "../serve.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(process.env.TINYGPT_ORT_MODULES || path.join(here, "node_modules"), "x.js"));
const ort = require("onnxruntime-node");

const FAULT = process.env.TINYGPT_ENGINE_FAULT || "";
// final-softcap-dropped is planted in the export (export_onnx.py reads the same variable), not here.
if (!["", "positions-restart", "never-trimmed", "final-softcap-dropped"].includes(FAULT)) {
  console.error(`adapter.mjs: unknown TINYGPT_ENGINE_FAULT ${FAULT}`);
  process.exit(2);
}

let session = null;
let cfg = null;      // {layers, heads, headDim, context, vocab}
let past = null;     // per layer [k, v] ort.Tensor (B, G, S, hd): G the KV heads
let pos = 0;         // tokens fed so far: the next position (never wrapped)

const f32 = (data, dims) => new ort.Tensor("float32", data, dims);

function emptyPast(B) {
  const { layers, heads, headDim } = cfg;
  const out = [];
  for (let l = 0; l < layers; ++l)
    out.push([0, 1].map(() => new ort.Tensor("float32", new Float32Array(0), [B, heads, 0, headDim])));
  return out;
}

async function run(rows, start) {
  const B = rows.length, T = rows[0].length;
  if (rows.some((r) => r.length !== T)) throw new Error("rows of unequal length");
  const ids = new ort.Tensor("int64", BigInt64Array.from(rows.flat().map((v) => BigInt(v))), [B, T]);
  const feeds = { ids, start: new ort.Tensor("int64", BigInt64Array.from([BigInt(start)]), []) };
  if (!past || past[0][0].dims[0] !== B) past = emptyPast(B);
  for (let l = 0; l < cfg.layers; ++l) {
    feeds[`past_k_${l}`] = past[l][0];
    feeds[`past_v_${l}`] = past[l][1];
  }
  const out = await session.run(feeds);
  const keep = FAULT === "never-trimmed" ? Infinity : cfg.context;
  past = [];
  for (let l = 0; l < cfg.layers; ++l) past.push([lastEntries(out[`present_k_${l}`], keep, f32), lastEntries(out[`present_v_${l}`], keep, f32)]);
  const V = out.logits.dims[1], logits = [];
  for (let b = 0; b < B; ++b) logits.push(Array.from(out.logits.data.subarray(b * V, (b + 1) * V)));
  return logits;
}

async function handle(req) {
  switch (req.op) {
    case "hello":
      return { ok: true, name: "onnxruntime-node " + (ort.env?.versions?.common || "1.30.0") + (FAULT ? ` (fault ${FAULT})` : ""),
               formats: ["onnx"], sampler: false };
    case "load": {
      if (req.format !== "onnx") throw new Error("this adapter loads format onnx only");
      session = await ort.InferenceSession.create(req.checkpoint, { intraOpNumThreads: 1, interOpNumThreads: 1 });
      const k = session.inputNames.filter((n) => n.startsWith("past_k_")).length;
      const meta = req.config || {};
      // The cache's shape: KV heads and head size (a zoo member's differ from n_heads and d / n_heads).
      const heads = meta.n_heads || 4;
      cfg = { layers: k, heads: meta.n_kv_heads || heads, headDim: meta.head_dim || (meta.d_model || 256) / heads,
              context: meta.context || 256 };
      past = null;
      pos = 0;
      return { ok: true };
    }
    case "reset":
      past = null;
      pos = 0;
      return { ok: true };
    case "prefill":
    case "step": {
      if (!session) throw new Error("no model loaded");
      if (req.op === "step" && req.ids.some((r) => r.length !== 1)) throw new Error("step takes one id per row");
      const start = FAULT === "positions-restart" ? 0 : pos;
      const logits = await run(req.ids, start);
      pos += req.ids[0].length;
      return { ok: true, logits };
    }
    default:
      throw new Error(`unknown op ${req.op}`);
  }
}

await serve(handle);
