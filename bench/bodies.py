#!/usr/bin/env python3
"""Request bodies for the proxy benchmarks: ~1 KiB of JSON each, written to DIR/body_{a,b,c}.json.

(a) asks for a ~1 KiB non-streamed answer, (b) for 62 tokens = 64 SSE events (62 tokens, the finish
chunk, [DONE]), (c) for a stream that outlives any hold. Used by bench/proxy.sh and
bench/instructions.sh so both send exactly the same requests.

    bodies.py DIR [--bytes N] [--openai-order]

--bytes N makes each body about N bytes (the user message grows; default 1024). --openai-order
writes the keys in the order openai-python sends them, `messages` first and `model` after it, so a
gateway that routes by model must read past the whole chat to find it (the default puts `model`
first).
"""
import argparse
import json

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("work")
parser.add_argument("--bytes", type=int, default=1024)
parser.add_argument("--openai-order", action="store_true")
args = parser.parse_args()
phrase = "the quick brown fox jumps over the lazy dog while the gateway routes every request by key "
words = phrase * (args.bytes // len(phrase) + 2)


def body(max_tokens, stream):
    messages = [{"role": "user", "content": ""}]
    if args.openai_order:
        b = {"messages": messages, "model": "bch-sim", "max_tokens": max_tokens, "stream": stream}
    else:
        b = {"model": "bch-sim", "max_tokens": max_tokens, "stream": stream, "messages": messages}
    messages[0]["content"] = words[: args.bytes - len(json.dumps(b))].rstrip()
    return json.dumps(b)


for name, mt, stream in (("a", 170, False), ("b", 62, True), ("c", 100000, True)):
    with open(f"{args.work}/body_{name}.json", "w") as f:
        f.write(body(mt, stream))
