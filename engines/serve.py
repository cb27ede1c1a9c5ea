"""What the Python adapters share (engines/reference, engines/transformers, engines/llama-server): the conform
protocol's request loop - one JSON request a line on stdin, one JSON answer a line on stdout, flushed; an
exception in `handle` becomes {"ok": false, "error": "Type: message"}, reported against the request that
caused it; "quit" ends the loop. Written for any Python 3 the adapters run under (bookworm's 3.11 on the
host, forky's 3.14 in the chroot, where the repository is mounted at /suite); imports nothing else.
"""
import json
import sys


def serve(handle, after=None):
    """Answers each request with handle(req); `after(req, answer)`, when given, may change an answer
    before it is written (an engine variant that alters what it says). Returns at "quit" or end of input."""
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "quit":
            return
        try:
            out = handle(req)
        except Exception as e:  # the suite reports it against the request that caused it
            out = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        if after is not None:
            out = after(req, out)
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
