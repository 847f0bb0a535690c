"""Steps of bench/scale.sh: gatewayd with many static workers that need not be live.

Each step is a function named `step_<name>` taking the shared `Run` and adding its numbers to
`run.results`; `--steps a,b` picks them (default: all, in the order of STEPS). Workers are
`http://127.<a>.<b>.<c>:1`: nothing listens there, probes fail at once (connection refused) and
are slowed to one round an hour, new workers start healthy, scraping is off (`[load] source =
"local"` and no engine limits), so what is measured is the gateway's own cost of the fleet.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def worker_url(i):
    return f"http://127.{1 + i // 65536}.{(i // 256) % 256}.{i % 256}:1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """One gatewayd with `count` static workers, started by `start`, stopped by `stop`."""

    def __init__(self, binary, count, workdir):
        self.port, self.control = free_port(), free_port()
        self.config = os.path.join(workdir, f"scale-{count}.toml")
        lines = [
            "[server]",
            f'listen = "127.0.0.1:{self.port}"',
            f'control_listen = "127.0.0.1:{self.control}"',
            "[health]",
            "interval_ms = 3600000",
            "wait_for_first_probe = false",
            "passive = false",
        ]
        for i in range(count):
            lines += ["[[workers]]", f'name = "w{i}"', f'url = "{worker_url(i)}"']
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.binary, self.count, self.proc = binary, count, None
        self.log = os.path.join(workdir, f"gatewayd-{count}.log")

    def start(self):
        """Starts the gateway; returns seconds until `/readiness` answers 200 with every worker."""
        began = time.monotonic()
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--config", self.config], stdout=log, stderr=log
            )
        while time.monotonic() - began < 300:
            if self.proc.poll() is not None:
                sys.exit(f"gatewayd with {self.count} workers exited; see {self.log}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/readiness", timeout=5
                ) as answer:
                    if answer.status == 200:
                        return time.monotonic() - began
            except OSError:
                pass
            time.sleep(0.01)
        sys.exit(f"gatewayd with {self.count} workers not ready after 300 s")

    def call(self, method, path, body=None):
        """One control-plane call; returns its latency in seconds."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.control}{path}", data=data, method=method,
            headers={"content-type": "application/json"},
        )
        began = time.monotonic()
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
        return time.monotonic() - began

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class Run:
    def __init__(self, args, workdir):
        self.args, self.workdir, self.results = args, workdir, {}


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def step_startup(run):
    """Start-up time (launch to `/readiness` 200) at 16 and at `--workers` static workers."""
    for count in (16, run.args.workers):
        times = []
        for _ in range(run.args.repeats):
            gateway = Gateway(run.args.binary, count, run.workdir)
            try:
                times.append(gateway.start())
            finally:
                gateway.stop()
        run.results[f"startup_s_{count}"] = round(median(times), 4)
    small, large = run.results["startup_s_16"], run.results[f"startup_s_{run.args.workers}"]
    run.results["startup_ratio"] = round(large / small, 2)


def step_admin(run):
    """Admin add and remove of one worker at `--workers`, against a call that changes nothing
    (`PUT /admin/policy {}`, which goes through the same validate-and-apply path) and against a
    read (`GET /admin/policy`), interleaved in one run; medians over `--calls` rounds."""
    gateway = Gateway(run.args.binary, run.args.workers, run.workdir)
    read, noop, add, remove = [], [], [], []
    try:
        gateway.start()
        for i in range(run.args.calls):
            read.append(gateway.call("GET", "/admin/policy"))
            noop.append(gateway.call("PUT", "/admin/policy", {}))
            url = worker_url(run.args.workers + 1 + i)
            add.append(gateway.call("POST", "/admin/workers", {"name": f"extra{i}", "url": url}))
            remove.append(gateway.call("DELETE", f"/admin/workers/extra{i}"))
    finally:
        gateway.stop()
    n = run.args.workers
    run.results[f"admin_read_ms_{n}"] = round(median(read) * 1e3, 3)
    run.results[f"admin_noop_ms_{n}"] = round(median(noop) * 1e3, 3)
    run.results[f"admin_add_ms_{n}"] = round(median(add) * 1e3, 3)
    run.results[f"admin_remove_ms_{n}"] = round(median(remove) * 1e3, 3)
    run.results["admin_add_ratio"] = round(median(add) / median(noop), 1)
    run.results["admin_remove_ratio"] = round(median(remove) / median(noop), 1)
    run.results["admin_add_to_read_ratio"] = round(median(add) / median(read), 1)


STEPS = {"startup": step_startup, "admin": step_admin}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--workers", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bch-scale.") as workdir:
        run = Run(args, workdir)
        for name in args.steps.split(","):
            began = time.monotonic()
            STEPS[name](run)
            print(f"[scale] step {name}: {time.monotonic() - began:.1f} s", file=sys.stderr)
    text = json.dumps(run.results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
