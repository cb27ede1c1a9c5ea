#!/usr/bin/env node
// transformers.js under `tinygpt conform` (docs/protocol.md): the library loads our model as a
// transformers.js user would load a converted causal LM from disk (AutoModelForCausalLM on a folder
// with config.json and onnx/model.onnx, which engines/onnxruntime/export_onnx.py --transformers-js
// writes from the checkpoint conform hands over), and runs it through its own forward: its
// DynamicCache-style named past_key_values, its session, onnxruntime-node underneath.
//
// Positions (TINYGPT_TJS_POSITIONS):
//   library (default)  what its users get: the attention mask is passed and transformers.js derives
//                      position_ids from it (cumsum(mask) - 1, the last T). Once the cache is trimmed
//                      to the window (SPEC 4), the mask is never longer than context + 1, so every
//                      token past the window is put at position `context`: the past-window checks
//                      fail from position context + 1 on. A documented finding, kept showing by a test.
//   adapter            the adapter passes position_ids that keep growing (the SPEC 4 contract): passes.
// The adapter keeps the cache the way SPEC 4 says: after each call, the last `context` entries. It
// has no sampler: the sampler rows are skipped, saying so.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

import { lastEntries, serve } from "../serve.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = process.env.TINYGPT_TJS_MODULES || path.join(here, "..", "..", ".engines", "transformers.js", "node_modules");
const require = createRequire(path.join(modules, "x.js"));
const tjs = await import(pathToFileURL(require.resolve("@huggingface/transformers")).href);
const { AutoModelForCausalLM, Tensor, env } = tjs;
const VERSION = JSON.parse(fs.readFileSync(path.join(modules, "@huggingface", "transformers", "package.json"), "utf8")).version;

const POSITIONS = process.env.TINYGPT_TJS_POSITIONS || "library";
if (!["library", "adapter"].includes(POSITIONS)) {
  console.error(`adapter.mjs: TINYGPT_TJS_POSITIONS must be library or adapter, not ${POSITIONS}`);
  process.exit(2);
}
const PYTHON = process.env.TINYGPT_PYTHON || (fs.existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");

let model = null;
let cfg = null;   // {layers, context}
let past = null;  // {"past_key_values.L.key": Tensor (B, H, S, hd), ...} or null before the first call
let pos = 0;      // tokens fed so far: the next position (never wrapped)
let work = null;  // the folder the model was converted into

function cleanup() {
  if (work) fs.rmSync(work, { recursive: true, force: true });
}

const f32 = (data, dims) => new Tensor("float32", data, dims);

function int64(values, dims) {
  return new Tensor("int64", BigInt64Array.from(values.map((v) => BigInt(v))), dims);
}

async function run(rows) {
  const B = rows.length, T = rows[0].length;
  if (rows.some((r) => r.length !== T)) throw new Error("rows of unequal length");
  if (past && past["past_key_values.0.key"].dims[0] !== B) throw new Error("the batch size changed without a reset");
  const S = past ? past["past_key_values.0.key"].dims[2] : 0;
  const inputs = {
    input_ids: int64(rows.flat(), [B, T]),
    attention_mask: int64(new Array(B * (S + T)).fill(1), [B, S + T]),
    past_key_values: past,
  };
  if (POSITIONS === "adapter") {
    const p = [];
    for (let b = 0; b < B; ++b) for (let t = 0; t < T; ++t) p.push(pos + t);
    inputs.position_ids = int64(p, [B, T]);
  }
  const out = await model.forward(inputs);
  past = {};
  for (let l = 0; l < cfg.layers; ++l)
    for (const kv of ["key", "value"]) past[`past_key_values.${l}.${kv}`] = lastEntries(out[`present.${l}.${kv}`], cfg.context, f32);
  const [, Tl, V] = out.logits.dims, logits = [];
  for (let b = 0; b < B; ++b) logits.push(Array.from(out.logits.data.subarray((b * Tl + Tl - 1) * V, (b * Tl + Tl) * V)));
  return logits;
}

async function handle(req) {
  switch (req.op) {
    case "hello":
      return { ok: true, name: `transformers.js ${VERSION} (positions from the ${POSITIONS === "library" ? "library, as its users get them" : "adapter"})`,
               formats: ["pt", "transformers-js"], sampler: false };
    case "load": {
      if (req.format !== "pt" && req.format !== "transformers-js")
        throw new Error("this adapter loads formats pt (it converts it for transformers.js) and transformers-js only");
      cleanup();
      let folder = req.checkpoint;  // transformers-js: the folder tinygpt wrote (a zoo member: its own model_type)
      if (req.format === "pt") {
        work = fs.mkdtempSync(path.join(os.tmpdir(), "tinygpt-tjs-"));
        folder = path.join(work, "model");
        try {
          execFileSync(PYTHON, [path.join(here, "..", "onnxruntime", "export_onnx.py"), "--transformers-js", req.checkpoint, folder],
                       { stdio: ["ignore", "ignore", "pipe"] });
        } catch (e) {
          throw new Error(`converting the checkpoint failed: ${String(e.stderr || e.message).trim().split("\n").pop()}`);
        }
      }
      env.allowRemoteModels = false;
      env.localModelPath = path.dirname(folder);
      model = await AutoModelForCausalLM.from_pretrained(path.basename(folder), { local_files_only: true, dtype: "fp32", device: "cpu",
        session_options: { intraOpNumThreads: 1, interOpNumThreads: 1 } });
      const meta = req.config || {};
      cfg = { layers: model.config.num_hidden_layers, context: meta.context || model.config.max_position_embeddings };
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
      if (!model) throw new Error("no model loaded");
      if (req.op === "step" && req.ids.some((r) => r.length !== 1)) throw new Error("step takes one id per row");
      const logits = await run(req.ids);
      pos += req.ids[0].length;
      return { ok: true, logits };
    }
    default:
      throw new Error(`unknown op ${req.op}`);
  }
}

await serve(handle, cleanup);
