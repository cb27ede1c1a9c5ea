#!/usr/bin/env python3
"""A bundle of `tinygpt conform --repro` as a C program against llama.cpp's C API: no adapter, no Python.

  repro_c.py write BUNDLE [--adapter PATH] [--include DIR]... [--libs DIR]
      replays BUNDLE's requests through the llama.cpp adapter with TINYGPT_LLAMA_TRACE set (its repro.py
      with --engine), and writes the calls that answered them as BUNDLE/repro.c, the reference's logits
      for each answer as BUNDLE/expected.h, and a section of BUNDLE/REPORT.md with the build line. With
      --libs it builds the program and runs it, and the section says what it printed.
  repro_c.py run BUNDLE [--adapter PATH] [--include DIR]... [--libs DIR]
      builds BUNDLE/repro.c (into a temporary folder) and runs it on BUNDLE's model; exits as it did
      (1 while the failure is there, 0 once it is fixed, 2 when the model cannot be loaded).

--include and --libs default to the layout ci/engines.sh gives the adapter's folder (src/include,
src/ggml/include and bins/ beside the adapter); the adapter defaults to the bundle's engine command.
Needs a C compiler (cc) to build. For another system's llama.cpp (Debian forky's, in the chroot
ci/forky.sh makes): --foreign links against libraries whose own dependencies resolve only there, and
--run-with "engines/forky/run.sh" runs the program inside it (the bundle and the temporary folder must
be visible there: /tmp is). --forky is all four for the layout ci/engines.sh makes (llama.cpp 0.7's
headers in .engines/llama.cpp-0.7/include, its libraries in the chroot .engines/forky-root); exits 77 when
that layout is not here or the caller is not root (the chroot needs it).
"""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

SECTION = "## Without the adapter: `repro.c`"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Debian forky's llama.cpp 0.7 as ci/engines.sh lays it out: its headers, its chroot, the chroot's runner.
FORKY_INCLUDE = os.path.join(ROOT, ".engines", "llama.cpp-0.7", "include")
FORKY_ROOT = os.path.join(ROOT, ".engines", "forky-root")
FORKY_RUN = os.path.join(ROOT, "engines", "forky", "run.sh")


def fail(msg):
    sys.stderr.write("repro_c: %s\n" % msg)
    sys.exit(2)


def load_spec(bundle):
    path = os.path.join(bundle, "requests.json")
    if not os.path.isfile(path):
        fail("%s has no requests.json (not a bundle of tinygpt conform --repro)" % bundle)
    with open(path) as f:
        return json.load(f)


def adapter_of(args, spec):
    adapter = args.adapter or spec["engine"]
    if not os.path.isfile(adapter) or not os.access(adapter, os.X_OK):
        fail("the llama.cpp adapter %s is not an executable (--adapter; ci/engines.sh builds it)" % adapter)
    return os.path.abspath(adapter)


def toolchain(args, adapter):
    """The include folders and the library folder, and the libraries to link by name."""
    here = os.path.dirname(adapter)
    includes = [os.path.abspath(d) for d in args.include or [os.path.join(here, "src", "include"), os.path.join(here, "src", "ggml", "include")]]
    libs = os.path.abspath(args.libs or os.path.join(here, "bins"))
    for d in includes + [libs]:
        if not os.path.isdir(d):
            fail("no folder %s (--include for llama.h and ggml-backend.h, --libs for libllama)" % d)

    def lib(name):  # a plain libNAME.so, else a versioned one (npm's prebuilt: libllama.v0.4.0.so)
        if os.path.exists(os.path.join(libs, "lib%s.so" % name)):
            return "-l" + name
        found = sorted(glob.glob(os.path.join(libs, "lib%s.v*.so" % name)))
        if not found:
            fail("no lib%s.so in %s" % (name, libs))
        return "-l:" + os.path.basename(found[-1])

    return includes, libs, [lib("llama"), lib("ggml"), lib("ggml-base")]


def build_line(includes, libs, link, out, foreign=False):
    return ["cc", "-O2", "-std=c11", "-o", out, "repro.c"] + ["-I" + d for d in includes] + ["-L" + libs] + link + [
        "-lm", "-ldl"] + (["-Wl,--allow-shlib-undefined", "-Wl,--unresolved-symbols=ignore-in-shared-libs"] if foreign else
                          ["-Wl,-rpath," + libs])


def build_and_run(bundle, spec, includes, libs, link, foreign=False, run_with=()):
    """(exit code, its last line, its output) of repro.c built in a temporary folder and run (after run_with)."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "repro")
        cmd = build_line(includes, libs, link, exe, foreign)
        b = subprocess.run(cmd, cwd=bundle, capture_output=True, text=True)
        if b.returncode != 0:
            fail("repro.c did not build: %s\n%s" % (" ".join(cmd), b.stderr[-3000:]))
        model = os.path.join(bundle, spec["load"]["checkpoint"])
        r = subprocess.run(list(run_with) + [exe, model], cwd=bundle, capture_output=True, text=True)
        lines = r.stdout.strip().splitlines()
        return r.returncode, (lines[-1] if lines else r.stderr.strip()[-300:]), r.stdout


def trace(bundle, adapter):
    """The adapter's calls for the bundle's requests (up to the first wrong answer: repro.py stops there)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.jsonl")
        engine = "TINYGPT_LLAMA_TRACE=%s %s" % (shlex.quote(path), shlex.quote(adapter))
        r = subprocess.run([sys.executable, os.path.join(bundle, "repro.py"), "--engine", engine], capture_output=True, text=True)
        if r.returncode == 2 or not os.path.exists(path):
            fail("the adapter could not replay the bundle: %s" % (r.stdout + r.stderr)[-2000:])
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()], r.returncode


def c_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def c_ints(values, indent="      "):
    out, line = [], []
    for v in values:
        line.append(str(v))
        if len(line) == 20:
            out.append(indent + ", ".join(line) + ",")
            line = []
    if line:
        out.append(indent + ", ".join(line) + ",")
    return "\n".join(out)


def generate(spec, calls, bundle):
    steps = spec["steps"]
    context = next((c for c in calls if c.get("call") == "context"), None)
    if context is None:
        fail("the trace has no context: the adapter did not load the model")
    body, expected, buffers, request, answered = [], [], 0, 0, 0
    for c in calls:
        if "request" in c:
            request = c["request"]
            if request > len(steps) or steps[request - 1]["request"]["op"] != c["op"]:
                fail("the trace's request %d (%s) is not the bundle's" % (request, c["op"]))
            body.append("")
            body.append("  /* %d. %s */" % (request, steps[request - 1]["says"].replace("*/", "* /")))
            continue
        if request == 0:
            continue  # the load's own clear, before the first request
        kind = c["call"]
        if kind == "memory_clear":
            body.append("  llama_memory_clear(mem, true);")
        elif kind == "seq_rm":
            body.append("  llama_memory_seq_rm(mem, %d, %d, %d);" % (c["seq"], c["p0"], c["p1"]))
        elif kind == "seq_cp":
            body.append("  llama_memory_seq_cp(mem, %d, %d, %d, %d);" % (c["src"], c["dst"], c["p0"], c["p1"]))
        elif kind == "seq_add":
            body.append("  llama_memory_seq_add(mem, %d, %d, %d, %d);" % (c["seq"], c["p0"], c["p1"], c["delta"]))
        elif kind == "state_get":
            buffers = max(buffers, c["buffer"] + 1)
            body.append("  state_get(%d, %d);" % (c["seq"], c["buffer"]))
        elif kind == "state_set":
            body.append("  state_set(%d, %d);" % (c["seq"], c["buffer"]))
        elif kind == "decode":
            segs = c["segments"]
            body.append("  {")
            for k, s in enumerate(segs):
                body.append("    static const llama_token t%d[] = {\n%s\n    };" % (k, c_ints(s["tokens"])))
            body.append("    const struct segment s[] = {%s};" % ", ".join(
                "{%d, %d, %d, t%d}" % (s["seq"], s["pos"], len(s["tokens"]), k) for k, s in enumerate(segs)))
            body.append("    decode(%d, s, %s);" % (len(segs), c_string("request %d" % request)))
            body.append("  }")
        elif kind == "logits":
            want = steps[request - 1].get("logits")
            if want is None:
                continue
            name = "expect_%d_%d" % (request, c["answer_row"])
            expected.append((name, want[c["answer_row"]]))
            where = "request %d of %d (%s), answer row %d" % (request, len(steps), steps[request - 1]["says"], c["answer_row"])
            body.append("  expect(%d, %s, %d, %s);" % (c["i"], name, len(want[c["answer_row"]]), c_string(where)))
            answered += 1
        else:
            fail("the trace has a call this generator does not know: %s" % kind)
    f = spec["failure"]
    header = """/* repro.c: %(title)s, as the llama.cpp calls that answered the requests of requests.json (traced from
 * the adapter %(engine)s), every answer's logits compared with the reference's (expected.h) at the
 * bundle's bound %(bound)g. Exit 1 while the failure is there, 0 once it is fixed, 2 when the model
 * cannot be loaded. The failure as found: %(says)s
 *
 * Build (llama.h and ggml-backend.h from llama.cpp's include/ and ggml/include/, libllama and libggml
 * from its build; the prebuilt packages name them libllama.vX.Y.Z.so: -l:libllama.vX.Y.Z.so):
 *   cc -O2 -std=c11 -o repro repro.c -I LLAMA/include -I LLAMA/ggml/include -L LIBS \\
 *      -lllama -lggml -lggml-base -lm -ldl -Wl,-rpath,LIBS
 * Run: ./repro [model.gguf]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ggml-backend.h>
#include <llama.h>

#include "expected.h"

#define BOUND %(bound).9g

static struct llama_context* ctx;
static llama_memory_t mem;
static int n_vocab;
static uint8_t* buffer[%(nbuf)d];
static size_t buffer_size[%(nbuf)d];

/* A sequence's tokens at consecutive positions, logits of its last. */
struct segment {
  llama_seq_id seq;
  llama_pos pos;
  int n;
  const llama_token* tokens;
};

/* One llama_decode of the segments, in order. */
static void decode(int n_segments, const struct segment* s, const char* where) {
  int total = 0;
  for (int k = 0; k < n_segments; ++k) total += s[k].n;
  struct llama_batch b = llama_batch_init(total, 0, 1);
  for (int k = 0, at = 0; k < n_segments; ++k)
    for (int i = 0; i < s[k].n; ++i, ++at) {
      b.token[at] = s[k].tokens[i];
      b.pos[at] = s[k].pos + i;
      b.n_seq_id[at] = 1;
      b.seq_id[at][0] = s[k].seq;
      b.logits[at] = i + 1 == s[k].n;
    }
  b.n_tokens = total;
  const int rc = llama_decode(ctx, b);
  llama_batch_free(b);
  if (rc != 0) {
    printf("FAIL %%s: llama_decode returned %%d\\n", where, rc);
    exit(1);
  }
}

/* The logits of batch entry i against the reference's: the largest |diff| within BOUND. */
static void expect(int i, const float* want, int n, const char* where) {
  const float* got = llama_get_logits_ith(ctx, i);
  if (!got || n != n_vocab) {
    printf("FAIL %%s: no logits of %%d ids (the vocabulary has %%d)\\n", where, n, n_vocab);
    exit(1);
  }
  double worst = -1;
  int at = 0;
  for (int v = 0; v < n; ++v) {
    const double d = isnan(got[v]) ? INFINITY : fabs((double)got[v] - (double)want[v]);
    if (d > worst) worst = d, at = v;
  }
  if (!(worst <= BOUND)) {
    printf("FAIL %%s: logit %%d is %%.9g where the reference has %%.6g: |diff| %%.3g > %%g\\n", where, at, got[at], want[at], worst, BOUND);
    exit(1);
  }
  printf("ok   %%s: |diff| %%.3g\\n", where, worst);
}

/* A sequence's cells as llama_state_seq_get_data gives them, and put back into a sequence. */
static void state_get(llama_seq_id seq, int k) {
  buffer_size[k] = llama_state_seq_get_size(ctx, seq);
  buffer[k] = malloc(buffer_size[k] ? buffer_size[k] : 1);
  if (llama_state_seq_get_data(ctx, buffer[k], buffer_size[k], seq) != buffer_size[k]) {
    printf("FAIL: llama_state_seq_get_data wrote another size than it said\\n");
    exit(1);
  }
}
static void state_set(llama_seq_id seq, int k) {
  if (llama_state_seq_set_data(ctx, buffer[k], buffer_size[k], seq) == 0) {
    printf("FAIL: llama_state_seq_set_data refused the state\\n");
    exit(1);
  }
}

static void quiet(enum ggml_log_level level, const char* text, void* user) {
  (void)user;
  if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "model.gguf";
  llama_log_set(quiet, NULL);
  /* The CPU backends of a build that loads them at run time sit beside libllama. */
  Dl_info info;
  char dir[4096] = ".";
  if (dladdr((void*)&llama_backend_init, &info) && info.dli_fname && strrchr(info.dli_fname, '/')) {
    snprintf(dir, sizeof dir, "%%s", info.dli_fname);
    *strrchr(dir, '/') = 0;
  }
  ggml_backend_load_all_from_path(dir);
  llama_backend_init();
  struct llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  struct llama_model* model = llama_model_load_from_file(path, mp);
  if (!model) {
    printf("repro: llama_model_load_from_file failed on %%s\\n", path);
    return 2;
  }
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = %(n_ctx)d;
  cp.n_batch = %(n_batch)d;
  cp.n_ubatch = %(n_ubatch)d;
  cp.n_seq_max = %(n_seq_max)d;
  cp.kv_unified = %(kv_unified)s;
  cp.swa_full = %(swa_full)s;
  cp.type_k = GGML_TYPE_%(type_k)s;
  cp.type_v = GGML_TYPE_%(type_v)s;
  cp.flash_attn_type = %(flash)s;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.no_perf = true;
  ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    printf("repro: llama_init_from_model failed\\n");
    return 2;
  }
  mem = llama_get_memory(ctx);
  n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  printf("repro: %%s, %%d requests, %%d answers compared at |diff| <= %%g\\n", path, %(nreq)d, %(answered)d, BOUND);
""" % {
        "title": "%s %s" % (spec["hello"].get("name", "the engine"), "`%s` failing in %d requests" % (spec["row"], len(steps))),
        "engine": spec["engine"], "bound": spec["bound"], "says": f["says"].replace("*/", "* /"), "nbuf": max(buffers, 1),
        "n_ctx": context["n_ctx"], "n_batch": context["n_batch"], "n_ubatch": context["n_ubatch"], "n_seq_max": context["n_seq_max"],
        "kv_unified": "true" if context["kv_unified"] else "false", "swa_full": "true" if context["swa_full"] else "false",
        "type_k": context["type_k"].upper(), "type_v": context["type_v"].upper(),
        "flash": "LLAMA_FLASH_ATTN_TYPE_ENABLED" if context["flash_attn"] else "LLAMA_FLASH_ATTN_TYPE_DISABLED",
        "nreq": request, "answered": answered,
    }
    footer = """
  printf("PASS: every answer is within %g of the reference: the failure is gone\\n", BOUND);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
"""
    with open(os.path.join(bundle, "repro.c"), "w") as out:
        out.write(header + "\n".join(body) + "\n" + footer)
    with open(os.path.join(bundle, "expected.h"), "w") as out:
        out.write("/* The reference's logits for each answer repro.c compares (requests.json's, as float32). */\n")
        for name, values in expected:
            out.write("static const float %s[%d] = {\n" % (name, len(values)))
            for k in range(0, len(values), 8):
                out.write("  " + ", ".join("%.9g" % v for v in values[k:k + 8]) + ",\n")
            out.write("};\n")
    return request, answered


def report_section(spec, outcome):
    line = " ".join(build_line(["LLAMA/include", "LLAMA/ggml/include"], "LIBS", ["-lllama", "-lggml", "-lggml-base"], "repro"))
    text = [SECTION, "",
            "`repro.c` makes the llama.cpp calls that answered these requests - traced from the adapter: the context's",
            "parameters, each `llama_decode`'s batch, `llama_memory_seq_rm`/`_cp`/`_add`, the states saved and put back -",
            "and compares every answer's logits with the reference's (`expected.h`) at the same bound: exit 1 while the",
            "failure is there, 0 once it is fixed. It needs llama.cpp's headers and libraries, nothing of tinygpt-verify.",
            "", "```sh", line, "./repro model.gguf", "```", ""]
    if outcome:
        rc, last, _ = outcome
        text += ["Built against %s and run when this bundle was written: exit %d, `%s`" % (
            spec["hello"].get("name", "the engine"), rc, last.replace("`", "'")), ""]
    return "\n".join(text)


def put_section(bundle, section):
    path = os.path.join(bundle, "REPORT.md")
    with open(path) as f:
        doc = f.read()
    # The section goes before "## The requests" (replacing an earlier one), else at the end.
    doc = re.sub(re.escape(SECTION) + r".*?(?=\n## |\Z)", "", doc, flags=re.S).rstrip("\n") + "\n"
    anchor = "\n## The requests"
    if anchor in doc:
        at = doc.index(anchor) + 1
        doc = doc[:at] + section + "\n" + doc[at:]
    else:
        doc += "\n" + section
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["write", "run"])
    ap.add_argument("bundle")
    ap.add_argument("--adapter", help="the llama.cpp adapter (default: the bundle's engine command)")
    ap.add_argument("--include", action="append", help="a folder of llama.cpp's headers (repeatable)")
    ap.add_argument("--libs", help="the folder of libllama and libggml")
    ap.add_argument("--foreign", action="store_true", help="the libraries are another system's (link without resolving theirs)")
    ap.add_argument("--run-with", default="", help="a command that runs the program (e.g. engines/forky/run.sh)")
    ap.add_argument("--forky", action="store_true", help="Debian forky's llama.cpp 0.7 from ci/engines.sh's layout, run in its chroot")
    args = ap.parse_args()
    if args.forky:
        if not (os.path.isfile(os.path.join(FORKY_ROOT, "versions.txt")) and os.path.isdir(FORKY_INCLUDE)):
            print("repro_c: no llama.cpp 0.7 here (ci/engines.sh makes .engines/forky-root and .engines/llama.cpp-0.7)")
            return 77
        if os.geteuid() != 0:
            print("repro_c: the forky chroot needs root")
            return 77
        args.include = [FORKY_INCLUDE]
        args.libs = os.path.join(os.path.realpath(FORKY_ROOT), "usr", "lib", "x86_64-linux-gnu")
        args.foreign, args.run_with = True, FORKY_RUN
    run_with = shlex.split(args.run_with)
    if run_with and os.path.exists(run_with[0]):
        run_with[0] = os.path.abspath(run_with[0])  # the program runs in the bundle's folder
    bundle = os.path.abspath(args.bundle)
    spec = load_spec(bundle)
    if not os.path.isfile(os.path.join(bundle, spec["load"]["checkpoint"])):
        fail("%s has no %s (requests.json's export command writes it)" % (bundle, spec["load"]["checkpoint"]))
    adapter = adapter_of(args, spec)
    if args.what == "run":
        if not os.path.isfile(os.path.join(bundle, "repro.c")):
            fail("%s has no repro.c (repro_c.py write)" % bundle)
        includes, libs, link = toolchain(args, adapter)
        rc, last, out = build_and_run(bundle, spec, includes, libs, link, args.foreign, run_with)
        sys.stdout.write(out)
        return rc
    calls, replay_rc = trace(bundle, adapter)
    request, answered = generate(spec, calls, bundle)
    print("repro_c: repro.c makes the calls of %d request%s (%d answer%s compared); repro.py through the adapter exited %d"
          % (request, "" if request == 1 else "s", answered, "" if answered == 1 else "s", replay_rc))
    outcome = None
    if args.libs or not args.include:
        includes, libs, link = toolchain(args, adapter)
        outcome = build_and_run(bundle, spec, includes, libs, link, args.foreign, run_with)
        print("repro_c: repro.c built and run: exit %d: %s" % (outcome[0], outcome[1]))
    put_section(bundle, report_section(spec, outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main())
