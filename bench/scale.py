"""Steps of bench/scale.sh: gatewayd with many static workers that need not be live.

Each step is a function named `step_<name>` taking the shared `Run` and adding its numbers to
`run.results`; `--steps a,b` picks them (default: all, in the order of STEPS). Workers are
`http://127.<a>.<b>.<c>:1`: nothing listens there, probes fail at once (connection refused) and
are slowed to one an hour (but in the `probes` step, which measures them), new workers start healthy, scraping is off (`[load] source =
"local"` and no engine limits), so what is measured is the gateway's own cost of the fleet.
"""

import argparse
import base64
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

    def __init__(self, binary, count, workdir, health=("interval_ms = 3600000",)):
        self.port, self.control = free_port(), free_port()
        self.config = os.path.join(workdir, f"scale-{count}.toml")
        lines = [
            "[server]",
            f'listen = "127.0.0.1:{self.port}"',
            f'control_listen = "127.0.0.1:{self.control}"',
            "[health]",
            *health,
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

    def cpu_seconds(self):
        """User plus system CPU the gateway process has used so far (`/proc/<pid>/stat`)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def open_fds(self):
        """File descriptors the gateway holds open now (its sockets among them)."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

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
    """Start-up time at 16 and at `--workers` static workers: launch to the data plane's first
    `/readiness` 200, i.e. until the data plane would route a request to a worker (configuration
    read and checked, ring and table built, listeners answering). Workers start healthy and need
    not be live; the first probe round runs after, in the background, and is not counted."""
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


def step_probes(run):
    """The health prober's cost at `--workers`, probing at the default `interval_ms = 2000`
    (every probe refused at once: nothing listens; `unhealthy_threshold` out of reach, so no
    worker's health flips and what is measured is probing, not the router's health changes):
    the gateway's CPU (user + system) over the first interval after `/readiness` (each worker's
    first probe, and the periodic probes that come due in it), over the two intervals after that
    (periodic probes only: per worker per second), and the most file descriptors it held open in
    the first interval (sampled every few ms; each probe in flight is one socket)."""
    n, interval = run.args.workers, 2.0
    health = (f"interval_ms = {int(interval * 1000)}", "unhealthy_threshold = 1000000")
    gateway = Gateway(run.args.binary, n, run.workdir, health=health)
    try:
        gateway.start()
        ready, cpu_ready, fds_most = time.monotonic(), gateway.cpu_seconds(), 0
        while time.monotonic() - ready < interval:
            fds_most = max(fds_most, gateway.open_fds())
            time.sleep(0.005)
        cpu_first = gateway.cpu_seconds()
        time.sleep(2 * interval)
        cpu_steady = gateway.cpu_seconds()
        steady_s = time.monotonic() - ready - interval
    finally:
        gateway.stop()
    run.results[f"probe_cpu_first_interval_s_{n}"] = round(cpu_first - cpu_ready, 3)
    run.results[f"probe_cpu_us_per_worker_second_{n}"] = round((cpu_steady - cpu_first) / steady_s / n * 1e6, 2)
    run.results[f"probe_fds_most_{n}"] = fds_most


def websocket_bytes_to_first_tick(port, version, limit_s=120):
    """Opens `GET /ws?v=<version>` on the control plane at `port` and reads until the first
    `tick` frame is whole; returns every byte received after the upgrade's answer (frame headers
    included), the frame types seen, and the seconds it took."""
    began = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=limit_s)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (f"GET /ws?v={version} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
         f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()
    )
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            sys.exit("the gateway closed /ws before the upgrade")
        buffer += chunk
    head, buffer = buffer.split(b"\r\n\r\n", 1)
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        sys.exit(f"/ws answered {head[:80]!r}")
    received, types, message = len(buffer), [], b""

    def need(count):
        nonlocal buffer, received
        while len(buffer) < count:
            chunk = sock.recv(1 << 20)
            if not chunk:
                sys.exit(f"the gateway closed /ws after {types}")
            buffer += chunk
            received += len(chunk)
        taken, buffer = buffer[:count], buffer[count:]
        return taken

    while time.monotonic() - began < limit_s:
        first, second = need(2)
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(need(2), "big")
        elif length == 127:
            length = int.from_bytes(need(8), "big")
        payload = need(length)
        opcode = first & 0x0F
        if opcode in (0x1, 0x0):  # text, or the continuation of one
            message += payload
            if first & 0x80:
                kind = json.loads(message).get("type")
                types.append(kind)
                message = b""
                if kind == "tick":
                    sock.close()
                    return received, types, time.monotonic() - began
    sys.exit(f"no tick within {limit_s} s on /ws (frames {types})")


def step_ws(run):
    """All `/ws` bytes up to and including the first tick, at 16, 1,000 and `--workers`, for the
    console's protocol (version 2) and the one every older client gets (version 1)."""
    for count in sorted({16, 1000, run.args.workers}):
        gateway = Gateway(run.args.binary, count, run.workdir)
        try:
            gateway.start()
            for version in (2, 1):
                size, types, took = websocket_bytes_to_first_tick(gateway.control, version)
                run.results[f"ws_v{version}_bytes_{count}"] = size
                run.results[f"ws_v{version}_frames_{count}"] = ",".join(types)
                run.results[f"ws_v{version}_s_{count}"] = round(took, 3)
        finally:
            gateway.stop()
    n = run.args.workers
    run.results["ws_v2_ratio"] = round(run.results[f"ws_v2_bytes_{n}"] / run.results["ws_v2_bytes_16"], 1)


def criterion_median_ns(group_path):
    """The median estimate (ns) criterion wrote for `group_path` (its directory under
    target/criterion: '/' in group names becomes '_')."""
    path = os.path.join(run_target_dir(), "criterion", group_path, "new", "estimates.json")
    with open(path) as f:
        return json.load(f)["median"]["point_estimate"]


def run_target_dir():
    metadata = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                              check=True, capture_output=True, text=True).stdout
    return json.loads(metadata)["target_directory"]


def cargo_bench(package, bench, pattern):
    """One criterion run, short (warm-up 1 s, measurement 3 s), of the benchmarks matching
    `pattern`; False (said on stderr) when the benchmark does not build or run."""
    done = subprocess.run(["cargo", "bench", "--quiet", "-p", package, "--bench", bench, "--",
                           pattern, "--warm-up-time", "1", "--measurement-time", "3"],
                          stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        print(f"[scale] cargo bench -p {package} --bench {bench} failed", file=sys.stderr)
    return done.returncode == 0


def step_decision(run):
    """One bounded decision (route plus release) at 16 and 10,000 workers, idle:
    `cargo bench -p bch-core --bench routing`, group `scale/N_workers`."""
    if not cargo_bench("bch-core", "routing", "^scale/(16|10000)_workers/idle$"):
        return
    for count in (16, 10000):
        run.results[f"decision_ns_{count}"] = round(criterion_median_ns(f"scale_{count}_workers/idle"), 1)
    run.results["decision_ratio"] = round(run.results["decision_ns_10000"] / run.results["decision_ns_16"], 2)


def step_draw(run):
    """The console's draw time per frame, the whole console at 200×50, at 16, 1,000 and 10,000
    workers: `cargo bench -p bch-tui --bench draw`, group `draw_scale`."""
    if not cargo_bench("bch-tui", "draw", "^draw_scale/200x50/"):
        return
    for count in (16, 1000, 10000):
        run.results[f"draw_ms_{count}"] = round(criterion_median_ns(f"draw_scale/200x50/{count}") / 1e6, 3)
    run.results["draw_ratio"] = round(run.results["draw_ms_10000"] / run.results["draw_ms_16"], 2)


def step_goals(run):
    """The issue's goals as same-run ratios, each against its limit (only those measured)."""
    n, r = run.args.workers, run.results
    goals = [
        ("decision at 10,000 / at 16", r.get("decision_ratio"), 1.5),
        (f"admin add at {n} / no-op call", r.get("admin_add_ratio"), 20),
        (f"admin remove at {n} / no-op call", r.get("admin_remove_ratio"), 20),
        (f"first /ws bytes at {n} (v2, MB)", r.get(f"ws_v2_bytes_{n}") and r[f"ws_v2_bytes_{n}"] / 1e6, 3),
        (f"start-up at {n} / at 16", r.get("startup_ratio"), 3),
    ]
    for name, value, limit in goals:
        if value is not None:
            verdict = "met" if value <= limit else "NOT met"
            print(f"[scale] goal {name}: {value:.2f} (limit {limit}) {verdict}", file=sys.stderr)
            r[f"goal {name}"] = {"value": round(value, 2), "limit": limit, "met": value <= limit}


STEPS = {
    "startup": step_startup,
    "admin": step_admin,
    "ws": step_ws,
    "decision": step_decision,
    "draw": step_draw,
    "probes": step_probes,
    "goals": step_goals,
}


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
