#!/usr/bin/env python3
"""Request bodies for the proxy benchmarks: ~1 KiB of JSON each, written to DIR/body_{a,b,c}.json.

(a) asks for a ~1 KiB non-streamed answer, (b) for 62 tokens = 64 SSE events (62 tokens, the finish
chunk, [DONE]), (c) for a stream that outlives any hold. Used by bench/proxy.sh and
bench/instructions.sh so both send exactly the same requests.
"""
import json
import sys

work = sys.argv[1]
words = ("the quick brown fox jumps over the lazy dog while the gateway routes every request by key " * 30)


def body(max_tokens, stream):
    b = {"model": "bch-sim", "max_tokens": max_tokens, "stream": stream,
         "messages": [{"role": "user", "content": ""}]}
    b["messages"][0]["content"] = words[: 1024 - len(json.dumps(b))].rstrip()
    return json.dumps(b)


for name, mt, stream in (("a", 170, False), ("b", 62, True), ("c", 100000, True)):
    with open(f"{work}/body_{name}.json", "w") as f:
        f.write(body(mt, stream))
