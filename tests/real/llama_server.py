#!/usr/bin/env python3
"""llama.cpp's own HTTP server (the C++ `llama-server` code, as the `xllamacpp` wheel embeds it) on
127.0.0.1:PORT with `/metrics` on, one slot: the worker whose `llamacpp:requests_processing` and
`llamacpp:requests_deferred` gauges tests/real/checks.py has gatewayd scrape. llama-cpp-python's
server, the other real workers, exports no metrics. Serves until killed.

    python tests/real/llama_server.py --model MODEL.gguf --port PORT
"""

import argparse
import threading

import xllamacpp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.endpoint_metrics = True
    # One slot: a second request waits, so the deferred gauge is exercised too.
    params.n_parallel = 1
    params.n_ctx = 2048
    params.cpuparams.n_threads = 1
    server = xllamacpp.Server(params)
    print(f"listening on {server.listening_address}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
