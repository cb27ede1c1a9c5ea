"""A zoo member (or the fixture) loaded into an engine's conform adapter (docs/protocol.md), for the minimal
reproductions of engine findings (swa_rollback.py, yarn_shift.py, ../conform/quantized_prefix_hit.py): the
GGUF written by our exporter, the adapter started, hello and load done; `call` sends one request and returns
its answer (exiting on a refusal)."""
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile


def expectation(argv):
    """(--expect's value, default parts; the other arguments)."""
    args = list(argv)
    expect = "parts"
    if "--expect" in args:
        i = args.index("--expect")
        expect = args[i + 1]
        del args[i:i + 2]
    return expect, args


@contextlib.contextmanager
def member_engine(tinygpt, command, member, **load):
    """`member`: a zoo member's name, or "fixture"; `load`: more fields of the load request (weight_type)."""
    golden = os.path.join(os.path.dirname(__file__), "..", "..", "golden")
    checkpoint = os.path.join(golden, "fixture.safetensors") if member == "fixture" else os.path.join(golden, "zoo", member, "model.safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        gguf = os.path.join(tmp, member + ".gguf")
        subprocess.run([tinygpt, "export", "--format", "gguf", "--checkpoint", checkpoint, gguf], check=True, stdout=subprocess.DEVNULL)
        env = dict(os.environ, TMPDIR=tmp)  # the forky wrapper mounts $TMPDIR, where the file is
        p = subprocess.Popen(shlex.split(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

        def call(req):
            p.stdin.write(json.dumps(req) + "\n")
            p.stdin.flush()
            a = json.loads(p.stdout.readline())
            if not a.get("ok", False):
                sys.exit("engine refused %s: %s" % (req["op"], a.get("error")))
            return a

        call({"op": "hello", "protocol": 3})
        call(dict({"op": "load", "checkpoint": gguf, "format": "gguf", "config": {"context": 256}}, **load))
        try:
            yield call
        finally:
            p.stdin.write(json.dumps({"op": "quit"}) + "\n")
            p.stdin.close()
            p.wait(timeout=60)
