// wllama (llama.cpp compiled to WebAssembly, npm @wllama/wllama 2.4.0: what JavaScript users run in a
// browser) under `tinygpt conform`, on Node 24 (its wasm needs memory64): ci/engines.sh fetches both.
//   node24 engines/wllama/adapter.mjs        (TINYGPT_WLLAMA=.engines/wllama/package)
//
// In Node wllama needs what a browser gives it: a module Worker made from a blob: URL (here a shim over
// worker_threads that reads the Blob back, with the worker's postMessage/onmessage and the
// emscripten code's __dirname), and document.baseURI for its paths. One thread, F32 K and V, flash
// attention off: llama.cpp's exact settings for our model.
//
// wllama keeps one sequence (hello: max_rows 1): rows that need several are skipped, saying so. It
// gives no logits, only probabilities (getLogits(-1): softmax of the raw logits over the vocabulary),
// so each answer is their log - the logits less their log-sum-exp - declared as `log-probabilities`:
// the reference rows are judged by mean KL, which a constant per row leaves unchanged; `self`
// compares the engine with itself, where the constant is the same on both sides.
//
// SPEC 4's window: positions keep growing in our model; here, after each step past the window, the
// oldest entry goes with kvRemove(0, 1), which also renumbers the rest one down (its keys re-rotated:
// llama.cpp's K-shift). RoPE sees distances only, so the attention is SPEC 4's up to that rounding.
// `shift` is kvRemove(keep, discard) itself: llama.cpp's context shift. No sampler is exposed for
// given logits (hello says "sampler": false).
// Planted fault for the tests, TINYGPT_ENGINE_FAULT=window-never-trimmed: the oldest entry never removed
// (the cache grows past the window until n_ctx).
import { Worker as NodeWorker } from "node:worker_threads";
import { resolveObjectURL } from "node:buffer";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { join } from "node:path";
import { serve } from "../serve.mjs";

const PKG = process.env.TINYGPT_WLLAMA;
const FAULT = process.env.TINYGPT_ENGINE_FAULT || "";
if (!PKG) {
  process.stderr.write("wllama adapter: set TINYGPT_WLLAMA to the extracted @wllama/wllama package (ci/engines.sh)\n");
  process.exit(2);
}
if (FAULT && FAULT !== "window-never-trimmed") {
  process.stderr.write(`wllama adapter: unknown TINYGPT_ENGINE_FAULT ${FAULT}\n`);
  process.exit(2);
}

// stdout carries the protocol: wllama's own messages (console.log/debug/info) go to stderr.
for (const level of ["log", "debug", "info", "warn"])
  console[level] = (...args) => process.stderr.write(`wllama ${level}: ${args.map(String).join(" ")}\n`);

// --- the browser pieces wllama expects ---
globalThis.document = { baseURI: pathToFileURL(join(PKG, "esm") + "/").href };
const PRELUDE = `const { parentPort } = require("node:worker_threads");
globalThis.postMessage = (d, t) => parentPort.postMessage(d, t);
parentPort.on("message", (d) => globalThis.onmessage({ data: d }));
globalThis.__dirname = ${JSON.stringify(join(PKG, "esm", "single-thread"))};
`;
// A module Worker from a blob: URL: the code is read back from the Blob (asynchronously), so messages
// posted before the thread starts wait in a queue.
globalThis.Worker = class {
  constructor(url) {
    this.queue = [];
    this.onmessage = null;
    this.onerror = null;
    resolveObjectURL(url).text().then((code) => {
      this.thread = new NodeWorker(PRELUDE + code, { eval: true });
      this.thread.on("message", (d) => this.onmessage && this.onmessage({ data: d }));
      this.thread.on("error", (e) => this.onerror && this.onerror(e));
      for (const [d, t] of this.queue) this.thread.postMessage(d, t);
      this.queue = null;
    });
  }
  postMessage(d, t) {
    if (this.queue) this.queue.push([d, t]);
    else this.thread.postMessage(d, t);
  }
  terminate() {
    if (this.thread) this.thread.terminate();
  }
};

const { Wllama } = await import(pathToFileURL(join(PKG, "esm", "index.js")).href);
const VERSION = JSON.parse(readFileSync(join(PKG, "package.json"), "utf8")).version;

let w = null, context = 0;

// The current step's log-probabilities over the vocabulary, in id order.
async function logProbs() {
  const probs = await w.getLogits(-1);  // sorted by probability, every id once
  const out = new Array(probs.length);
  for (const { token, p } of probs) {
    if (!(p > 0)) throw new Error(`probability ${p} for id ${token}: no finite log`);
    out[token] = Math.log(p);
  }
  return out;
}

// Feeds tokens to the one sequence; past the window the oldest entries go (SPEC 4).
async function feed(ids) {
  await w.decode(ids, {});
  const over = w.nCachedTokens - context;
  if (over > 0 && FAULT !== "window-never-trimmed") await w.kvRemove(0, over);
  return logProbs();
}

async function handle(req) {
  switch (req.op) {
    case "hello": {
      const out = { ok: true, name: `wllama ${VERSION} (WebAssembly, Node ${process.versions.node})` + (FAULT ? ` [${FAULT}]` : ""),
                    formats: ["gguf"], sampler: false, max_rows: 1, deviations: ["gelu-tanh", "rope-angle-recurrence", "log-probabilities"] };
      if ((req.protocol || 1) >= 3) Object.assign(out, { protocol: 3, operations: ["ragged", "shift"] });
      return out;
    }
    case "load": {
      if (req.format !== "gguf") throw new Error("wllama loads format gguf only");
      context = req.config.context;
      w = new Wllama({ "single-thread/wllama.wasm": join(PKG, "esm", "single-thread", "wllama.wasm") }, { suppressNativeLog: true });
      await w.loadModel([new Blob([readFileSync(req.checkpoint)])],
                       { n_ctx: 4 * context, n_batch: 512, n_threads: 1, cache_type_k: "f32", cache_type_v: "f32", flash_attn: false });
      return { ok: true };
    }
    case "reset":
      await w.kvClear();
      return { ok: true };
    case "prefill": {
      if (req.ids.length !== 1) throw new Error(`wllama keeps one sequence: ${req.ids.length} rows asked`);
      await w.kvClear();
      return { ok: true, logits: [await feed(req.ids[0].slice(-context))], rows: [0] };
    }
    case "step": {
      if (req.ids.length !== 1 || (req.rows && (req.rows.length !== 1 || req.rows[0] !== 0)))
        throw new Error("wllama keeps one sequence (row 0)");
      return { ok: true, logits: [await feed([req.ids[0][0]])] };
    }
    case "shift": {  // llama.cpp's context shift: the `discard` entries after the first `keep` go, the rest move down
      if (req.row !== 0 || req.keep < 0 || req.discard < 1 || req.keep + req.discard > w.nCachedTokens)
        throw new Error(`cannot drop ${req.discard} entries after the first ${req.keep} of ${w.nCachedTokens}`);
      await w.kvRemove(req.keep, req.discard);
      return { ok: true };
    }
    case "release":
      await w.kvClear();
      return { ok: true };
    default:
      throw new Error(`unknown op ${JSON.stringify(req.op)}`);
  }
}

serve(handle);
