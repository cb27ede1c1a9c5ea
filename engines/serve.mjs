// What the Node adapters share (engines/onnxruntime, engines/transformers.js): the conform protocol's
// request loop (one JSON request a line on stdin, one JSON answer a line on stdout; an exception in
// `handle` becomes {"ok": false, "error": ...}; "quit" ends it) and SPEC 4's window kept on a
// (B, H, S, hd) float32 tensor.

import { createInterface } from "node:readline";

// Serves requests with `handle(req) -> answer` until stdin closes or "quit" comes; then `done()`.
export async function serve(handle, done = () => {}) {
  const rl = createInterface({ input: process.stdin, terminal: false });
  for await (const line of rl) {
    if (!line.trim()) continue;
    const req = JSON.parse(line);
    if (req.op === "quit") break;
    let answer;
    try {
      answer = await handle(req);
    } catch (e) {
      answer = { ok: false, error: String(e.message || e) };
    }
    process.stdout.write(JSON.stringify(answer) + "\n");
  }
  done();
  process.exit(0);
}

// The last `keep` entries along the sequence axis of t (B, H, S, hd), as a new tensor made by
// `make(data, dims)`; t itself when it holds no more than that.
export function lastEntries(t, keep, make) {
  const [B, H, S, hd] = t.dims;
  if (S <= keep) return t;
  const out = new Float32Array(B * H * keep * hd);
  for (let bh = 0; bh < B * H; ++bh) out.set(t.data.subarray((bh * S + (S - keep)) * hd, (bh * S + S) * hd), bh * keep * hd);
  return make(out, [B, H, keep, hd]);
}
