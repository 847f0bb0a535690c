#!/usr/bin/env python3
"""Stand-in workers for bench/scrape.sh: N loopback HTTP/1.1 servers (keep-alive) that answer
GET /health with 200 and GET /metrics with a fixed Prometheus text, either a vLLM-sized exposition
(about 40 KB: the two load gauges among a dozen histograms, as vLLM serves it) or a small one (the
two gauges only). Prints one bound port per line, then serves until killed. All servers share one
asyncio loop, so one process serves thousands (two file descriptors a worker: its listener and the
scraper's connection; bench/scrape.sh starts one process per 4,000 workers under a 20,000 fd limit).

    python3 bench/metrics_server.py --count 64 --body vllm
"""
import argparse
import asyncio
import sys


def vllm_body() -> bytes:
    model = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    lines = []
    for gauge, value in [("vllm:num_requests_running", 3), ("vllm:num_requests_waiting", 1),
                         ("vllm:gpu_cache_usage_perc", 0.42), ("vllm:num_preemptions_total", 0)]:
        lines += [f"# HELP {gauge} Some help text.", f"# TYPE {gauge} gauge",
                  f'{gauge}{{engine="0",{model}}} {value}']
    for h in range(12):
        name = f"vllm:histogram_number_{h}_seconds"
        lines += [f"# HELP {name} Histogram of something in seconds.", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{engine="0",le="{le}.0",{model}}} {le * 7}.0' for le in range(25)]
        lines += [f'{name}_bucket{{engine="0",le="+Inf",{model}}} 200.0',
                  f'{name}_count{{engine="0",{model}}} 200.0',
                  f'{name}_sum{{engine="0",{model}}} 12.5']
    return ("\n".join(lines) + "\n").encode()


SMALL = b"vllm:num_requests_running 3.0\nvllm:num_requests_waiting 1.0\n"


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> None:
    """HTTP/1.1 keep-alive: answers each request head as it comes, until the peer closes."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
            answer = body if path == b"/metrics" else b"ok"
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n"
                         b"content-length: %d\r\n\r\n" % len(answer) + answer)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def serve(count: int, body: bytes) -> None:
    # One event loop for every server: thousands of workers cost a socket each, not a thread.
    servers = [await asyncio.start_server(lambda r, w: serve_connection(r, w, body), "127.0.0.1", 0,
                                          backlog=64)
               for _ in range(count)]
    for server in servers:
        print(server.sockets[0].getsockname()[1])
    sys.stdout.flush()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--body", choices=["vllm", "small"], default="vllm")
    args = parser.parse_args()
    asyncio.run(serve(args.count, vllm_body() if args.body == "vllm" else SMALL))


if __name__ == "__main__":
    main()
