#!/usr/bin/env python3
"""Attributes gatewayd's heap at its peak to the owners of a held stream's memory.

Reads heaptrack's folded peak-cost stacks (`heaptrack_print -F FILE --flamegraph-cost-type peak`)
and sums each stack's bytes under the first owner whose marker appears in it, innermost frame
first. Prints bytes per held stream for each owner, largest first, given the number of streams.
"""

import argparse
import collections

# (owner, markers): a stack belongs to the first owner with a frame matching one of its markers.
# The frames are heaptrack's "function (file)" names, so the markers are written as they appear.
OWNERS = [
    # TLS on the client side (bench/held_memory.sh --tls): rustls's per-connection state, first, as
    # its stacks also pass through the connection's frames named below.
    ("rustls receive buffer (4 KiB, kept while idle)", ["prepare_read (buffers.rs)"]),
    (
        "rustls record keys (AES-GCM encrypter and decrypter)",
        ["encrypter (tls13.rs)", "decrypter (tls13.rs)"],
    ),
    # Empty once the records are written and read, but a VecDeque keeps its capacity.
    ("rustls record queues (send, received plaintext)", ["(vecbuf.rs)"]),
    (
        "TLS session (tokio-rustls stream, boxed)",
        ["{closure#0}<> (server.rs);map<> (option.rs);{async_fn#0}<> (server.rs)"],
    ),
    (
        "rustls connection state (ServerConnection, its state machine)",
        ["new (server_conn.rs)", "new<> (boxed.rs);handle (tls13.rs)"],
    ),
    (
        "TLS configuration and resumption cache (shared, bounded)",
        ["with_single_cert (builder.rs)", "(persist.rs)"],
    ),
    (
        "TLS handshake in progress (boxed future, messages, transcript)",
        [
            "pin<> (boxed.rs);{async_fn#0}<> (server.rs)",
            "{async_fn#0}<> (accept.rs)",
            "process_new_packets<> (conn.rs)",
        ],
    ),
    # hyper's server connection (builds before gatewayd's own HTTP/1 server served the data plane).
    ("hyper connection write buffer (8 KiB each)", ["new<> (io.rs);new<> (io.rs);new<> (conn.rs)"]),
    ("hyper client request channel (tokio mpsc block)", ["channel<> (dispatch.rs)", "new<> (block.rs)"]),
    ("hyper dispatcher and body channels", ["(dispatch.rs)", "new_channel (incoming.rs)"]),
    # gatewayd's own.
    ("gatewayd stream state (proxy body)", ["stream (body.rs)"]),
    ("client connection state (socket, read-ahead)", ["new<> (sync.rs);{async_fn#0}<> (connection.rs)"]),
    (
        "request before its response head (boxed proxy future)",
        [
            "{closure#0} (mod.rs);{closure#0}<> (server.rs);{async_fn#0}<> (connection.rs)",
            # Since the service gets its connection's stall flag without a wrapping closure.
            "{closure#0} (mod.rs);{async_fn#0}<> (connection.rs)",
        ],
    ),
    ("worker response head being read", ["poll_head (exchange.rs)"]),
    ("worker connects in progress", ["call<> (http.rs)"]),
    ("socket registrations (tokio I/O driver)", ["add_source<> (driver.rs)"]),
    ("read buffers (BytesMut: hyper's 8 KiB, or bytes read ahead)", ["reserve_inner (bytes_mut.rs)"]),
    ("connection task cells (the connection's future)", ["new_task<> (mod.rs)"]),
    ("other allocations made inside tasks", ["(harness.rs)"]),
]


def owner_of(stack):
    frames = stack.split(";")
    for name, markers in OWNERS:
        joined = ";".join(frames)
        if any(m in joined for m in markers):
            return name
    return "other"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folded", help="heaptrack_print -F output, peak cost")
    parser.add_argument("--streams", type=int, required=True, help="streams held at the peak")
    parser.add_argument("--rss-per-stream-kib", type=float, help="measured RSS per stream, for the total line")
    args = parser.parse_args()
    totals = collections.Counter()
    with open(args.folded) as f:
        for line in f:
            stack, _, cost = line.rstrip("\n").rpartition(" ")
            if cost.isdigit():
                totals[owner_of(stack)] += int(cost)
    heap = sum(totals.values())
    print(f"heap at the peak: {heap / 1024 / args.streams:.1f} KiB per held stream "
          f"({heap / 1e6:.1f} MB over {args.streams} streams; allocated, not all of it touched)")
    for name, cost in totals.most_common():
        print(f"  {cost / 1024 / args.streams:6.1f} KiB  {name}")
    if args.rss_per_stream_kib is not None:
        print(f"RSS per held stream (pages touched): {args.rss_per_stream_kib:.1f} KiB")


if __name__ == "__main__":
    main()
