#!/usr/bin/env python3
"""Workload (c) of bench/proxy.sh: open many SSE streams through a target and hold them.

Each stream is its own connection: POST a keyed, streaming chat completion, read the response headers
and the first `data:` chunk (that is the stream "opened"), then keep reading whatever comes until the
hold ends. Connects are ramped with a concurrency limit so the listen backlogs are not the thing being
measured. While every stream is open, the proxy process's RSS and CPU time are read from /proc.

One source address gives at most one connection per ephemeral port (net.ipv4.ip_local_port_range,
about 28,000 by default) to the one listening port, so beyond --per-source streams (default 25,000)
the connections are spread over several loopback source addresses, 127.0.0.1, 127.0.0.2, ...
(all of 127.0.0.0/8 is local on Linux). The proxy's own connections to its upstreams need ports too:
give it enough upstream ports (workers) for the count held.

With --ca-file every connection speaks TLS (ALPN http/1.1) and verifies the target's certificate
against that CA and the target's address (--host, an IP address or a name in the certificate);
verification is never turned off.

Prints one JSON object: streams asked/opened/failed, time to open them all, time-to-first-chunk
percentiles, and (with --pid) the process's RSS before/held, RSS per held stream, peak RSS and CPU
seconds used while opening and holding.
"""

import argparse
import asyncio
import json
import os
import ssl
import sys
import time


def proc_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # After the ")": state is field 3 of the full line, utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / ticks


def kernel_tcp_pages():
    """Pages the kernel charges to TCP socket buffers machine-wide (/proc/net/sockstat "TCP: ... mem"):
    queued bytes in socket buffers, kernel memory, never in a process's RSS."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                fields = line.split()
                return int(fields[fields.index("mem") + 1])
    return 0


def proc_status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def client_tls(ca_file):
    """A client context that verifies the server's certificate chain against `ca_file` and its
    name or IP address against the host connected to (Python's defaults: CERT_REQUIRED and
    check_hostname), offering HTTP/1.1 by ALPN as an HTTPS client does."""
    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


async def one_stream(host, port, path, body, key, source, tls, opened, release, stats):
    t0 = time.perf_counter()
    try:
        local = (source, 0) if source else None
        reader, writer = await asyncio.open_connection(host, port, local_addr=local, ssl=tls)
    except OSError as e:  # ssl.SSLError (a failed handshake or verification) is one
        stats["errors"].append(f"connect: {e}")
        opened.release_one(False)
        return
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nX-SMG-Routing-Key: {key}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        await writer.drain()
        status_line = await reader.readline()
        if b" 200 " not in status_line:
            raise RuntimeError(f"status {status_line.strip().decode(errors='replace')}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        # First data chunk (chunked framing: size line, data, ...). Read until a "data:" appears.
        seen = b""
        while b"data:" not in seen:
            chunk = await reader.read(4096)
            if not chunk:
                raise RuntimeError("stream ended before the first chunk")
            seen += chunk
        stats["ttfc"].append(time.perf_counter() - t0)
        opened.release_one(True)
        # Hold: keep draining so the proxy is not blocked on a full socket, until released.
        drain = asyncio.ensure_future(drain_until_closed(reader, stats))
        await release.wait()
        drain.cancel()
    except Exception as e:  # noqa: BLE001 - any failure is one failed stream, reported by message
        stats["errors"].append(str(e) or type(e).__name__)
        opened.release_one(False)
    finally:
        writer.close()


async def drain_until_closed(reader, stats):
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                stats["ended_early"] += 1
                return
            stats["bytes_held"] += len(chunk)
    except asyncio.CancelledError:
        pass
    except OSError:
        stats["ended_early"] += 1


class Counter:
    """Counts streams that opened or failed; wakes the waiter when all are accounted for."""

    def __init__(self, total):
        self.total, self.ok, self.failed = total, 0, 0
        self.done = asyncio.Event()
        self.connecting = asyncio.Semaphore(0)

    def release_one(self, ok):
        if ok:
            self.ok += 1
        else:
            self.failed += 1
        self.connecting.release()
        if self.ok + self.failed >= self.total:
            self.done.set()


def source_addresses(host, streams, per_source):
    """Loopback source addresses enough for `streams` at `per_source` each; none (the kernel picks)
    when one address is enough or the target is not on loopback."""
    needed = -(-streams // max(1, per_source))
    if needed <= 1:
        return []
    if not host.startswith("127."):
        sys.exit(f"hold_streams.py: {streams} streams need {needed} source addresses, "
                 f"which only a loopback target ({host}) gives here")
    if needed > 254:
        sys.exit(f"hold_streams.py: {streams} streams need {needed} loopback source addresses (at most 254)")
    return [f"127.0.0.{i}" for i in range(1, needed + 1)]


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    rank = max(0, min(len(values) - 1, int(round(p / 100 * len(values) + 0.5)) - 1))
    return values[rank]


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/v1/chat/completions")
    ap.add_argument("--body", required=True, help="file with the JSON request body")
    ap.add_argument("--streams", type=int, default=5000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--ramp", type=int, default=256, help="connects in flight at once")
    ap.add_argument("--hold", type=float, default=10.0, help="seconds to hold all streams open")
    ap.add_argument("--pid", type=int, help="process whose RSS and CPU to report")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--ca-file", help="speak TLS, verifying the target's certificate against this CA (PEM)")
    ap.add_argument("--per-source", type=int, default=25000,
                    help="streams per loopback source address before the next one (127.0.0.2, ...) is used")
    args = ap.parse_args()
    body = open(args.body, "rb").read()
    sources = source_addresses(args.host, args.streams, args.per_source)
    tls = client_tls(args.ca_file) if args.ca_file else None

    stats = {"errors": [], "ttfc": [], "ended_early": 0, "bytes_held": 0}
    tcp_pages_before = kernel_tcp_pages()
    rss_before = proc_status_kib(args.pid, "VmRSS") if args.pid else None
    cpu_before = proc_cpu_seconds(args.pid) if args.pid else None
    opened = Counter(args.streams)
    release = asyncio.Event()
    tasks = []
    t0 = time.perf_counter()
    for i in range(args.streams):
        if i >= args.ramp:
            await opened.connecting.acquire()
        tasks.append(
            asyncio.ensure_future(
                one_stream(args.host, args.port, args.path, body, f"key-{i % args.keys}",
                           sources[i // args.per_source] if sources else None, tls, opened, release, stats)
            )
        )
    try:
        await asyncio.wait_for(opened.done.wait(), args.timeout)
    except asyncio.TimeoutError:
        stats["errors"].append("timed out opening streams")
    open_s = time.perf_counter() - t0
    await asyncio.sleep(min(1.0, args.hold))
    rss_held = proc_status_kib(args.pid, "VmRSS") if args.pid else None
    tcp_pages_held = kernel_tcp_pages()
    cpu_open = proc_cpu_seconds(args.pid) if args.pid else None
    await asyncio.sleep(max(0.0, args.hold - 1.0))
    rss_end = proc_status_kib(args.pid, "VmRSS") if args.pid else None
    cpu_hold = proc_cpu_seconds(args.pid) if args.pid else None
    hwm = proc_status_kib(args.pid, "VmHWM") if args.pid else None
    release.set()
    await asyncio.gather(*tasks, return_exceptions=True)

    out = {
        "streams": args.streams,
        "tls": tls is not None,
        "opened": opened.ok,
        "failed": opened.failed,
        "ended_early": stats["ended_early"],
        "source_addresses": len(sources) or 1,
        "open_seconds": round(open_s, 3),
        "bytes_held": stats["bytes_held"],
        "ttfc_us": {
            "p50": int(percentile(stats["ttfc"], 50) * 1e6) if stats["ttfc"] else None,
            "p99": int(percentile(stats["ttfc"], 99) * 1e6) if stats["ttfc"] else None,
        },
        "errors": sorted(set(stats["errors"]))[:5],
        # Socket buffers of every TCP socket on the machine (both sides of every hop), per stream.
        "kernel_tcp_kib_per_stream": round((tcp_pages_held - tcp_pages_before) * os.sysconf("SC_PAGE_SIZE")
                                           / 1024 / max(1, opened.ok), 2),
    }
    if args.pid:
        held = max(rss_held, rss_end)
        out.update({
            "rss_before_kib": rss_before,
            "rss_held_kib": held,
            "rss_per_stream_kib": round((held - rss_before) / max(1, opened.ok), 2),
            "peak_rss_kib": hwm,
            "cpu_s_open": round(cpu_open - cpu_before, 3),
            "cpu_s_hold": round(cpu_hold - cpu_open, 3),
            "cpu_s_total": round(cpu_hold - cpu_before, 3),
        })
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    asyncio.run(main())
