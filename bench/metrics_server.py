#!/usr/bin/env python3
"""Stand-in workers for bench/scrape.sh: N loopback HTTP/1.1 servers (keep-alive) that answer
GET /health with 200 and GET /metrics with a fixed Prometheus text, either a vLLM-sized exposition
(about 40 KB: the two load gauges among a dozen histograms, as vLLM serves it) or a small one (the
two gauges only). Prints one bound port per line, then serves until killed.

    python3 bench/metrics_server.py --count 64 --body vllm
"""
import argparse
import http.server
import socketserver
import sys
import threading


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


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = SMALL

    def do_GET(self):
        body = self.body if self.path == "/metrics" else b"ok"
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--body", choices=["vllm", "small"], default="vllm")
    args = parser.parse_args()
    Handler.body = vllm_body() if args.body == "vllm" else SMALL
    servers = [Server(("127.0.0.1", 0), Handler) for _ in range(args.count)]
    for server in servers:
        print(server.server_address[1])
        threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
