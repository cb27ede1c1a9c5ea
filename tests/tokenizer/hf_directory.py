#!/usr/bin/env python3
"""A Hugging Face directory used with nothing but its own files (config.json, model.safetensors,
tokenizer.json): `tinygpt export --format hf` writes one from a zoo member; `generate --prompt` reads its
tokenizer.json with no --tokenizer; `golden update` then `verify --goldens` pass on it unchanged, and fail
once the tokenizer or one weight changes.

Usage: hf_directory.py TINYGPT WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENV = {k: v for k, v in os.environ.items() if k != "CI"}  # golden update writes only into WORK_DIR here
failures = []


def run(*args, expect=0):
    p = subprocess.run(list(args), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != expect:
        failures.append("%s: exit %d, expected %d:\n%s" % (" ".join(args[1:4]), p.returncode, expect, p.stdout[-1500:]))
    return p.stdout


def failing(report):
    try:
        with open(report) as f:
            return [r["check"] for r in json.load(f)["checks"] if r["status"] != "pass"]
    except (OSError, ValueError, KeyError) as e:
        return ["(no report: %s)" % e]


def main(tinygpt, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    d = os.path.join(work, "model")
    run(tinygpt, "export", "--format", "hf", "--checkpoint", os.path.join(ROOT, "golden", "zoo", "llama", "model.safetensors"), d)
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        failures.append("export --format hf wrote no tokenizer.json")
    # The directory's own tokenizer: the same ids as the series' file it came from, and --prompt needs nothing else.
    text = "In the beginning God created the heaven and the earth."
    ours = run(tinygpt, "encode", "--tokenizer", d, text).strip()
    series = run(tinygpt, "encode", "--tokenizer", os.path.join(ROOT, "golden", "tokenizer.json"), text).strip()
    if ours != series:
        failures.append("encode: the directory's tokenizer.json gives %s, the series' file %s" % (ours, series))
    out = run(tinygpt, "generate", "--checkpoint", d, "--prompt", "In the beginning", "--tokens", "8", "--threads", "1")
    if not out.startswith("In the beginning"):
        failures.append("generate --prompt on the directory printed %r" % out[:200])
    # Stop ids: the directory's generation_config.json ends a row at its eos id (the id printed), --stop none
    # runs every token, and an eos id past the vocabulary is refused naming the file's value.
    ids = run(tinygpt, "generate", "--checkpoint", d, "--ids", "1,2,3", "--tokens", "12", "--threads", "1").split(",")
    eos = ids[4]
    k = ids.index(eos)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": int(eos)}, f)
    said = run(tinygpt, "generate", "--checkpoint", d, "--ids", "1,2,3", "--tokens", "12", "--threads", "1").strip().splitlines()
    stopped = said[-1]
    if "a row ends at eos id %s (the directory's" % eos not in said[0]:
        failures.append("generate did not say where its stop ids came from: %s" % said[0])
    if stopped != ",".join(ids[:k + 1]).strip():
        failures.append("generate with eos %s: printed %s, expected %s" % (eos, stopped, ",".join(ids[:k + 1])))
    whole = run(tinygpt, "generate", "--checkpoint", d, "--ids", "1,2,3", "--tokens", "12", "--stop", "none", "--threads", "1")
    if whole.strip().split(",") != [i.strip() for i in ids]:
        failures.append("generate --stop none: printed %s, expected every one of %s" % (whole.strip(), ",".join(ids)))
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [int(eos), 999999]}, f)
    out = run(tinygpt, "generate", "--checkpoint", d, "--ids", "1,2,3", "--tokens", "4", "--threads", "1", expect=2)
    if "eos_token_id 999999 is past the model's vocabulary" not in out:
        failures.append("an eos id past the vocabulary: " + out[-300:])
    os.remove(os.path.join(d, "generation_config.json"))
    # Goldens for this model, then a verify against them: unchanged it passes.
    goldens = os.path.join(work, "goldens")  # golden update makes the folder
    run(tinygpt, "golden", "update", "--dir", goldens, "--checkpoint", d, "--threads", "1")
    verify = [tinygpt, "verify", "--dir", goldens, "--tokens", "40", "--checks", "tokens", "--faults", "none", "--threads", "2"]
    out = run(*verify, "--checkpoint", d, "--json", os.path.join(work, "same.json"))
    if "checks passed" not in out:
        failures.append("verify on the unchanged directory: " + out[-800:])
    # The tokenizer changed: the merge that makes " God" gone. The sample grid's prompt ("And God said")
    # encodes otherwise, and its golden rows fail.
    tok_dir = os.path.join(work, "tokenizer-changed")
    shutil.copytree(d, tok_dir)
    path = os.path.join(tok_dir, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    god = "\u0120God"
    before = len(doc["model"]["merges"])
    doc["model"]["merges"] = [m for m in doc["model"]["merges"] if m[0] + m[1] != god]
    if len(doc["model"]["merges"]) != before - 1:
        failures.append("the series' tokenizer has no merge making %r" % god)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    run(*verify, "--checkpoint", tok_dir, "--json", os.path.join(work, "tokenizer.json"), expect=1)
    failed = failing(os.path.join(work, "tokenizer.json"))
    if not failed or any(not n.startswith("golden:sample-grid/") for n in failed):
        failures.append("verify with the changed tokenizer: failing rows %s, expected the sample grid's goldens alone" % failed)
    # One weight changed (the first value of the embedding, in the file's own bytes).
    w_dir = os.path.join(work, "weight-changed")
    shutil.copytree(d, w_dir)
    path = os.path.join(w_dir, "model.safetensors")
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        name = "model.embed_tokens.weight"
        start = header[name]["data_offsets"][0]
        f.seek(8 + n + start)
        v = struct.unpack("<f", f.read(4))[0]
        f.seek(8 + n + start)
        f.write(struct.pack("<f", v + 0.5))
    run(*verify, "--checkpoint", w_dir, "--json", os.path.join(work, "weight.json"), expect=1)
    failed = failing(os.path.join(work, "weight.json"))
    if "golden:greedy-600" not in failed or any(not n.startswith("golden:") for n in failed):
        failures.append("verify with a changed weight: failing rows %s, expected goldens alone, greedy-600 among them" % failed)
    for f in failures:
        print("FAIL: " + f)
    if not failures:
        print("hf_directory: export, --prompt, golden update and verify on the directory's own files; the changed tokenizer "
              "and the changed weight each fail verify")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
