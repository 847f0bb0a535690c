"""Envoy 1.40 with gatewayd as its endpoint picker, in front of bch-drill simulated workers.

Started by tests/envoy/run.sh. Starts every process itself on free loopback ports (three workers,
one bch-drill process each so one can be killed; gatewayd with only the picker and the control
plane; Envoy with the bootstrap `gatewayd envoy-config` prints) and runs, in order:

  landing      200 keyed requests through Envoy land where `gatewayd explain` says
  correlation  the picker's request log line carries the client's x-request-id, method and path
  sse          1,000 SSE streams through Envoy equal the worker's own answer to the same request
  aborts       200 clients abort mid-stream: every worker's load is 0 within 100 ms
  burst        eight held same-key streams land 6:2 at gaps 0, 1, 2, 4 and 8:0 when strict
  worker-kill  a killed worker: the request reaches the next fallback and the load follows it
  target-miss  an unknown target worker: an immediate 503 in the OpenAI shape
  overload     a cap of 1 on a one-worker fleet: without a queue the second of two concurrent
               requests is shed (503, Retry-After, x-smg-error-code, x-bch-branch, OpenAI body);
               with a queue timeout its pick is held and it is admitted when the first ends
  picker-kill  a killed picker: requests get Envoy's 503 picker_unavailable, streams are cut;
               after a restart requests flow and the counters add up
  picker-mtls  a second gatewayd whose picker requires client certificates ([picker.tls] with
               client_ca_file; ECDSA P-256 certificates made with the openssl CLI): an Envoy
               with the bootstrap's TLS and its client certificate routes requests; an Envoy
               that verifies the picker but presents no certificate is refused at the handshake
               (Envoy's 503 picker_unavailable, a picker handshake failure counted)
  https-workers  three bch-drill workers serving https, requiring client certificates, each
               addressed by IP with its own server_name; gatewayd's [upstream.tls] with the CA
               and its client certificate; the bootstrap's TLS routes 30 keyed requests to the
               picked workers (the workers' own counters), a client without a certificate is
               refused by a worker, and a target-worker request to a worker whose certificate
               is from another CA gets Envoy's 503 (a verification failure counted), reaching
               neither that worker nor another one
  empty-fleet  no workers: an immediate 503 no_healthy_workers in the OpenAI shape

Prints one line per check and ends with `envoy: N passed, M failed`. Standard library only.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time

ARGS = None
PROCS = []
RESULTS = []


# ------------------------------------------------------------------------------------- plumbing
def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Proc:
    def __init__(self, name, cmd, stdout=None):
        self.name, self.cmd = name, cmd
        self.log = open(os.path.join(ARGS.work, f"{name}.log"), "ab")
        self.p = subprocess.Popen(cmd, stdout=stdout or self.log, stderr=self.log)
        PROCS.append(self)

    def stop(self, sig=signal.SIGTERM, wait=10):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(wait)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def wait_port(port, what, seconds=30, proc=None):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc is not None and proc.p.poll() is not None:
            raise RuntimeError(f"{what} exited (log {proc.log.name})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} not listening on {port} after {seconds} s")


def request(port, path, method="GET", body=None, headers=None, timeout=30):
    """One HTTP/1.1 exchange: (status, lower-cased headers, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    all_headers = {"content-type": "application/json"} if data is not None else {}
    all_headers.update(headers or {})
    conn.request(method, path, body=data, headers=all_headers)
    response = conn.getresponse()
    payload = response.read()
    result = (response.status, {k.lower(): v for k, v in response.getheaders()}, payload)
    conn.close()
    return result


def chat(key=None, prompt="hello", max_tokens=4, stream=False, extra=None):
    headers = dict(extra or {})
    if key is not None:
        headers["x-smg-routing-key"] = key
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": stream}
    return body, headers


class Held:
    """A streaming request held open on a raw socket: sent, headers and first event read."""

    def __init__(self, port, key, max_tokens=100000, extra=None):
        body, headers = chat(key, prompt=f"held {key}", max_tokens=max_tokens, stream=True, extra=extra)
        data = json.dumps(body).encode()
        lines = [f"POST /v1/chat/completions HTTP/1.1", "host: envoy", "content-type: application/json",
                 f"content-length: {len(data)}"] + [f"{k}: {v}" for k, v in headers.items()]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer or b"data:" not in self.buffer.split(b"\r\n\r\n", 1)[1]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"stream closed before its first event: {self.buffer[:300]!r}")
            self.buffer += chunk
        head = self.buffer.split(b"\r\n\r\n", 1)[0].decode()
        self.status = int(head.split(" ")[1])
        self.headers = {k.strip().lower(): v.strip()
                        for k, v in (line.split(":", 1) for line in head.split("\r\n")[1:])}

    def read_to_end(self, seconds=30):
        """Reads until the server closes or ends the chunked body; True if it ended."""
        self.sock.settimeout(seconds)
        try:
            while not self.buffer.endswith(b"0\r\n\r\n"):
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buffer += chunk
        except OSError:
            return False
        return True

    def close(self):
        self.sock.close()


# ------------------------------------------------------------------------------------- the fleet
class Fleet:
    def __init__(self):
        (self.envoy_port, self.admin_port, self.picker_port, self.control_port,
         self.data_port, *self.worker_ports) = free_ports(8)
        self.names = [f"w{i}" for i in range(len(self.worker_ports))]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.worker_ports]
        self.workers = [None] * len(self.worker_ports)
        self.config = os.path.join(ARGS.work, "gatewayd.toml")
        with open(self.config, "w") as f:
            f.write(f"""[server]
listen = "127.0.0.1:{self.data_port}"
control_listen = "127.0.0.1:{self.control_port}"
data_plane = false
shutdown_grace_ms = 1000

[picker]
listen = "127.0.0.1:{self.picker_port}"
fallbacks = 2

[policy]
kind = "bounded_consistent_hashing"
min_load_gap = 2
max_load_skew = 1.5

[health]
# Slow probes: the worker-kill check wants Envoy, not a probe, to find the dead worker first.
interval_ms = 5000

[log]
# Warnings, and the request log (its lines are what the correlation check reads), as JSON.
level = "warn,bch::access=info"
format = "json"
""")
            for name, url in zip(self.names, self.urls):
                f.write(f'\n[[workers]]\nname = "{name}"\nurl = "{url}"\n')
        for i in range(len(self.worker_ports)):
            self.start_worker(i)
        self.start_gatewayd()
        yaml = os.path.join(ARGS.work, "envoy.yaml")
        with open(yaml, "w") as out:
            subprocess.run([ARGS.gatewayd, "envoy-config", "--listen", f"127.0.0.1:{self.envoy_port}",
                            "--picker", f"127.0.0.1:{self.picker_port}", "--config", self.config,
                            "--admin", f"127.0.0.1:{self.admin_port}"], stdout=out, check=True)
        self.envoy = Proc("envoy", [ARGS.envoy, "-c", yaml, "--disable-hot-restart", "-l", "warning",
                                    "--concurrency", "2"])
        wait_port(self.envoy_port, "envoy", proc=self.envoy)
        # Ready when a request makes it through Envoy, the picker and a worker.
        deadline = time.time() + 30
        while True:
            body, headers = chat("warm-up")
            status, _, _ = request(self.envoy_port, "/v1/chat/completions", "POST", body, headers)
            if status == 200:
                break
            if time.time() > deadline:
                raise RuntimeError(f"no 200 through Envoy (last {status})")
            time.sleep(0.2)
        # Workers take traffic once their first probe passed ([health] wait_for_first_probe): a
        # worker that was not listening yet at the first round would otherwise be out until the
        # next one, 5 s later, and its keys elsewhere.
        while not all(w["healthy"] for w in self.workers_now().values()):
            if time.time() > deadline:
                raise RuntimeError(f"not every worker passed its first probe: {self.workers_now()}")
            time.sleep(0.1)
        self.wait_idle()

    def start_worker(self, i):
        self.workers[i] = Proc(f"worker-{i}", [
            ARGS.drill, "workers", "--count", "1", "--base-port", str(self.worker_ports[i]),
            "--time-scale", "1", "--cache-blocks", "0", "--max-batch", "100000",
            "--chunk-tokens", "100000", "--prefill-tokens-per-s", "inf",
            "--decode-base-ms", "10", "--decode-per-running-ms", "0"])
        wait_port(self.worker_ports[i], f"worker {i}", proc=self.workers[i])

    def start_gatewayd(self):
        self.gatewayd = Proc("gatewayd", [ARGS.gatewayd, "--config", self.config])
        wait_port(self.picker_port, "the picker", proc=self.gatewayd)
        wait_port(self.control_port, "the control plane", proc=self.gatewayd)

    def workers_now(self):
        # One kept-alive connection: polls cost one exchange, not a connect each.
        for attempt in (0, 1):
            try:
                if getattr(self, "control", None) is None:
                    self.control = http.client.HTTPConnection("127.0.0.1", self.control_port, timeout=10)
                self.control.request("GET", "/admin/workers")
                body = self.control.getresponse().read()
                return {w["name"]: w for w in json.loads(body)["workers"]}
            except (OSError, http.client.HTTPException):
                self.control = None
                if attempt:
                    raise

    def active(self):
        return {name: w["active"] for name, w in self.workers_now().items()}

    def metric(self, name):
        _, _, body = request(self.control_port, "/metrics")
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def wait_active(self, total, seconds=10):
        deadline = time.time() + seconds
        while True:
            loads = self.active()
            if sum(loads.values()) == total:
                return loads
            if time.time() > deadline:
                raise AssertionError(f"expected {total} in flight, have {loads}")
            time.sleep(0.002)

    def wait_idle(self, seconds=10):
        return self.wait_active(0, seconds)

    def url_of(self, name):
        return self.urls[self.names.index(name)]

    def name_of(self, url):
        return self.names[self.urls.index(url)]


def explain(workers, keys, policy="bounded_consistent_hashing"):
    """`gatewayd explain --batch`: the worker URL each key gets on an idle fleet of `workers`."""
    lines = "".join(json.dumps({"workers": workers, "routing_key": k, "explicit": True,
                                "min_load_gap": 2, "max_load_skew": 1.5, "policy": policy}) + "\n"
                    for k in keys)
    out = subprocess.run([ARGS.gatewayd, "explain", "--batch"], input=lines.encode(),
                         capture_output=True, check=True).stdout.decode()
    return [json.loads(line) for line in out.splitlines()]


def check(name):
    def wrap(fn):
        def run(fleet):
            started = time.time()
            try:
                detail = fn(fleet) or ""
                RESULTS.append((name, True))
                print(f"PASS {name} ({time.time() - started:.1f} s) {detail}", flush=True)
            except Exception as error:  # a failed check must not stop the others
                RESULTS.append((name, False))
                print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
                try:
                    fleet.wait_idle(5)
                except Exception:
                    pass
        run.check_name = name
        return run
    return wrap


def assert_openai_error(status, headers, body, want_status, code):
    assert status == want_status, (status, body[:200])
    assert headers.get("content-type") == "application/json", headers
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "code"}, error
    assert (error["type"], error["code"]) == ("gateway_error", code), error


# ------------------------------------------------------------------------------------- the checks
@check("landing")
def landing(fleet):
    keys = [f"user-{i:03d}" for i in range(200)]
    expected = explain(fleet.urls, keys)
    for key, want in zip(keys, expected):
        body, headers = chat(key, max_tokens=1)
        status, got, _ = request(fleet.envoy_port, "/v1/chat/completions", "POST", body, headers)
        assert status == 200, (key, status)
        assert got["x-bch-branch"] == "explicit_routing_key_hit", (key, got)
        assert fleet.url_of(got["x-bch-worker"]) == want["worker"], (key, got["x-bch-worker"], want)
    fleet.wait_idle()
    spread = {n: sum(1 for w in expected if w["worker"] == fleet.url_of(n)) for n in fleet.names}
    return f"200 keys, per worker {spread}"


def access_line(fleet, request_id, seconds=10):
    """The picker's request log line (JSON) whose request id is `request_id`: it is written when
    the request's ext_proc stream ends, just after the response, so it is awaited, bounded."""
    deadline = time.time() + seconds
    while True:
        with open(fleet.gatewayd.log.name, "rb") as log:
            for raw in log:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                fields = line.get("fields", {})
                if line.get("target") == "bch::access" and fields.get("request_id") == request_id:
                    return fields
        if time.time() > deadline:
            raise AssertionError(f"no request log line with request_id {request_id} in {seconds} s")
        time.sleep(0.05)


@check("correlation")
def correlation(fleet):
    # Without :method, :path and x-request-id in the ext_proc forward rules, the picker saw none
    # of them: every line said method=GET path="/" under an id of the picker's own.
    seen = []
    for method, path, request_id in [("POST", "/v1/chat/completions", f"bch-envoy-post-{os.getpid()}"),
                                     ("GET", "/v1/models", f"bch-envoy-get-{os.getpid()}")]:
        body, headers = chat("correlation", max_tokens=1)
        headers["x-request-id"] = request_id
        status, got, _ = request(fleet.envoy_port, path, method, body if method == "POST" else None, headers)
        assert status == 200, (method, path, status)
        fields = access_line(fleet, request_id)
        assert (fields.get("method"), fields.get("path")) == (method, path), fields
        assert fields.get("worker") == got["x-bch-worker"], (fields, got)
        seen.append(f"{method} {path} {request_id}")
    fleet.wait_idle()
    return "; ".join(seen)


SSE_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


def normalized(body):
    """The SSE body with the two fields the worker changes on every response blanked: `id` (its
    request counter) and `created` (the clock second)."""
    return SSE_VOLATILE.sub(rb'"\1":_', body)


@check("sse")
def sse(fleet):
    def one(i):
        body, headers = chat(f"sse-{i % 97}", prompt=f"stream number {i}", max_tokens=6, stream=True)
        status, got, via_envoy = request(fleet.envoy_port, "/v1/chat/completions", "POST", body, headers)
        assert status == 200 and got["content-type"].startswith("text/event-stream"), (status, got)
        port = int(fleet.url_of(got["x-bch-worker"]).rsplit(":", 1)[1])
        status, _, direct = request(port, "/v1/chat/completions", "POST", body, headers)
        assert status == 200
        assert via_envoy.count(b"data: ") == 8 and via_envoy.endswith(b"data: [DONE]\n\n"), via_envoy[-200:]
        assert normalized(via_envoy) == normalized(direct), (i, via_envoy[:300], direct[:300])
        return len(via_envoy)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        sizes = list(pool.map(one, range(1000)))
    fleet.wait_idle()
    return f"1000 streams, {sum(sizes)} bytes, equal to the direct answers"


@check("aborts")
def aborts(fleet):
    before = {n: w["requests_total"] for n, w in fleet.workers_now().items()}
    held = [Held(fleet.envoy_port, f"abort-{i}") for i in range(200)]
    assert all(h.status == 200 for h in held)
    fleet.wait_active(200)
    for h in held:
        h.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    first = time.time()
    for h in held:
        h.close()
    closed = time.time()  # the last client is gone: from here every counter must reach 0
    while sum(fleet.active().values()) != 0:
        assert time.time() - closed < 5, fleet.active()
        time.sleep(0.001)
    elapsed_ms = (time.time() - closed) * 1000
    after = fleet.workers_now()
    routed = sum(after[n]["requests_total"] - before[n] for n in after)
    assert routed == 200, routed
    assert elapsed_ms <= 100, f"{elapsed_ms:.0f} ms until every counter was 0"
    return f"all counters 0 {elapsed_ms:.0f} ms after the last close ({(closed - first) * 1000:.0f} ms to close all 200)"


@check("burst")
def burst(fleet):
    # Two idle workers, as in docs/policy.md's 6:2 burst: take w2 out of the picker's membership
    # (Envoy's cluster keeps it; the picker no longer names it).
    status, _, body = request(fleet.control_port, "/admin/workers/w2", "DELETE")
    assert status == 200, body
    seen = []
    for kind, gap, want in [("bounded_consistent_hashing", 0, [6, 2]),
                            ("bounded_consistent_hashing", 1, [6, 2]),
                            ("bounded_consistent_hashing", 2, [6, 2]),
                            ("bounded_consistent_hashing", 4, [6, 2]),
                            ("consistent_hashing", 2, [8, 0])]:
        status, _, body = request(fleet.control_port, "/admin/policy", "PUT",
                                  {"kind": kind, "min_load_gap": gap})
        assert status == 200, body
        held = []
        for i in range(8):
            held.append(Held(fleet.envoy_port, "session-a"))
            fleet.wait_active(i + 1)
        loads = sorted(fleet.active().values(), reverse=True)
        by_header = {}
        for h in held:
            by_header[h.headers["x-bch-worker"]] = by_header.get(h.headers["x-bch-worker"], 0) + 1
        for h in held:
            h.close()
        fleet.wait_idle()
        assert loads[:2] == want, (kind, gap, loads)
        assert sorted(by_header.values(), reverse=True) + [0] * (2 - len(by_header)) == want, by_header
        seen.append(f"{'gap ' + str(gap) if kind.startswith('bounded') else 'strict'} {loads[0]}:{loads[1]}")
    status, _, body = request(fleet.control_port, "/admin/policy", "PUT",
                              {"kind": "bounded_consistent_hashing", "min_load_gap": 2})
    assert status == 200, body
    return ", ".join(seen)


@check("worker-kill")
def worker_kill(fleet):
    members = [fleet.url_of("w0"), fleet.url_of("w1")]
    keys = [f"victim-{i}" for i in range(50)]
    key = next(k for k, a in zip(keys, explain(members, keys)) if a["worker"] == fleet.url_of("w0"))
    retries = fleet.metric("bch_retries_total")
    reports = fleet.metric("bch_picker_fallback_reports_total")
    errors = fleet.workers_now()["w0"]["errors_total"]
    first = Held(fleet.envoy_port, key)
    assert first.headers["x-bch-worker"] == "w0", first.headers
    fleet.workers[0].stop(signal.SIGKILL)
    first.read_to_end(10)
    first.close()
    fleet.wait_idle()  # the cut stream released its load
    second = Held(fleet.envoy_port, key)
    assert second.status == 200 and second.headers["x-bch-worker"] == "w1", second.headers
    loads = fleet.active()
    assert loads == {"w0": 0, "w1": 1}, loads
    # Envoy's report is a peer's word: counted, and it asks the prober to look at w0 now; the
    # probe (w0 is dead) marks it unhealthy. Nothing is counted against w0 on the report alone.
    assert fleet.metric("bch_picker_fallback_reports_total") == reports + 1
    assert fleet.metric("bch_retries_total") == retries
    deadline = time.time() + 10
    while fleet.workers_now()["w0"]["healthy"]:
        assert time.time() < deadline, fleet.workers_now()["w0"]
        time.sleep(0.05)
    now = fleet.workers_now()
    assert now["w0"]["errors_total"] == errors, now["w0"]
    second.close()
    fleet.wait_idle()
    # Back for the next checks; probes bring it back within healthy_threshold rounds.
    fleet.start_worker(0)
    return "the fallback w1 served, and holds the load"


@check("target-miss")
def target_miss(fleet):
    body, headers = chat(extra={"x-smg-target-worker": "nope"})
    status, got, payload = request(fleet.envoy_port, "/v1/chat/completions", "POST", body, headers)
    assert_openai_error(status, got, payload, 503, "target_worker_miss")
    assert got["x-bch-branch"] == "target_worker_miss", got
    fleet.wait_idle()


def admission(fleet, **settings):
    status, _, body = request(fleet.control_port, "/admin/policy", "PUT", {"admission": settings})
    assert status == 200, body


@check("overload")
def overload(fleet):
    # One worker with room for one request: keep a healthy one (w0, killed and restarted by the
    # worker-kill check, may still wait for its probes) and take the others out of the picker's
    # membership.
    keep = next(name for name, w in sorted(fleet.workers_now().items()) if w["healthy"])
    for name in list(fleet.workers_now()):
        if name != keep:
            status, _, body = request(fleet.control_port, f"/admin/workers/{name}", "DELETE")
            assert status == 200, body
    # The queue timeout stays under the 1 s ext_proc message_timeout of the configuration
    # `gatewayd envoy-config` printed for queue_timeout_ms = 0: Envoy waits that long for a held pick.
    admission(fleet, max_in_flight_per_worker=1, queue_timeout_ms=0, retry_after_ms=1500)
    shed_before = fleet.metric('bch_admission_shed_total{reason="no_queue"}')
    try:
        first = Held(fleet.envoy_port, "overload-a")
        assert first.status == 200 and first.headers["x-bch-worker"] == keep, first.headers
        fleet.wait_active(1)
        body, headers = chat("overload-b")
        status, got, payload = request(fleet.envoy_port, "/v1/chat/completions", "POST", body, headers)
        assert_openai_error(status, got, payload, 503, "worker_overload_protection_shed")
        assert got.get("retry-after") == "2", got  # 1500 ms, in whole seconds rounded up
        assert got.get("x-smg-error-code") == "worker_overload_protection_shed", got
        assert got.get("x-bch-branch"), got
        assert "x-bch-worker" not in got, got
        assert fleet.metric('bch_admission_shed_total{reason="no_queue"}') == shed_before + 1
        assert fleet.active() == {keep: 1}, fleet.active()  # the shed held no load
        shed_branch = got["x-bch-branch"]

        # With a queue: the second request's pick is held until the first ends.
        admission(fleet, queue_timeout_ms=800)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            second = pool.submit(request, fleet.envoy_port, "/v1/chat/completions", "POST", body, headers)
            deadline = time.time() + 5
            while fleet.metric("bch_admission_queue_length") != 1:
                assert time.time() < deadline and not second.done(), "the second request never queued"
                time.sleep(0.005)
            first.close()
            status, got, payload = second.result(10)
        assert status == 200, (status, payload[:200])
        assert got["x-bch-worker"] == keep and "x-bch-queue-wait-ms" in got, got
        assert fleet.metric("bch_admission_queue_length") == 0
        fleet.wait_idle()
        waited = got["x-bch-queue-wait-ms"]
    finally:
        admission(fleet, max_in_flight_per_worker=0, queue_timeout_ms=0, retry_after_ms=1000)
    return f"shed 503 ({shed_branch}), then a held pick admitted after {waited} ms"


@check("picker-kill")
def picker_kill(fleet):
    held = Held(fleet.envoy_port, "session-b")
    fleet.gatewayd.stop(signal.SIGKILL)
    cut = held.read_to_end(10)
    assert cut and not held.buffer.endswith(b"data: [DONE]\n\n0\r\n\r\n"), "the held stream was cut"
    held.close()
    body, headers = chat("session-b")
    status, got, payload = request(fleet.envoy_port, "/v1/chat/completions", "POST", body, headers)
    assert_openai_error(status, got, payload, 503, "picker_unavailable")
    fleet.start_gatewayd()
    # w0 came back at its old address; wait until every worker is healthy again.
    deadline = time.time() + 20
    while not all(w["healthy"] for w in fleet.workers_now().values()):
        assert time.time() < deadline, fleet.workers_now()
        time.sleep(0.1)
    keys = [f"after-{i}" for i in range(30)]
    expected = explain(fleet.urls, keys)
    for key, want in zip(keys, expected):
        body, headers = chat(key, max_tokens=2)
        status, got, _ = request(fleet.envoy_port, "/v1/chat/completions", "POST", body, headers)
        assert status == 200 and fleet.url_of(got["x-bch-worker"]) == want["worker"], (key, status, got)
    fleet.wait_idle()
    workers = fleet.workers_now()
    routed = sum(w["requests_total"] for w in workers.values())
    assert routed == len(keys), workers
    assert fleet.metric("bch_retries_total") == 0
    assert fleet.metric('bch_branch_total{branch="explicit_routing_key_hit"}') == len(keys)
    return f"503 picker_unavailable while down; after the restart {routed} requests, all counters consistent"


def make_ca(folder, ca):
    """A CA named `ca` in `folder` (ca.crt, ca.key), ECDSA P-256, made with the openssl CLI."""
    os.makedirs(folder, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", os.path.join(folder, f"{ca}.key"),
                    "-out", os.path.join(folder, f"{ca}.crt"), "-days", "2", "-subj", f"/CN=bch test {ca}",
                    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"],
                   check=True, capture_output=True)


def issue(folder, ca, name, extensions):
    """A certificate and key `name` in `folder`, signed by the CA `ca`, with `extensions` (lines
    of an openssl extension file: the SAN and the extended key usage)."""
    def path(file):
        return os.path.join(folder, file)

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", path(f"{name}.key"), "-out", path(f"{name}.csr"), "-subj", f"/CN={name}")
    with open(path(f"{name}.ext"), "w") as f:
        f.write(extensions + "\n")
    run("x509", "-req", "-in", path(f"{name}.csr"), "-CA", path(f"{ca}.crt"), "-CAkey", path(f"{ca}.key"),
        "-CAcreateserial", "-days", "2", "-out", path(f"{name}.crt"), "-extfile", path(f"{name}.ext"))


def make_certificates(folder):
    """A CA, the picker's certificate (IP SAN 127.0.0.1) and Envoy's client certificate, ECDSA
    P-256, made here with the openssl CLI (nothing downloaded)."""
    make_ca(folder, "ca")
    issue(folder, "ca", "picker", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    issue(folder, "ca", "envoy", "subjectAltName=DNS:envoy\nextendedKeyUsage=clientAuth")
    return lambda name: os.path.join(folder, name)


def picker_handshake_failures(control_port):
    _, _, body = request(control_port, "/metrics")
    return sum(float(line.split()[-1]) for line in body.decode().splitlines()
               if line.startswith('bch_tls_handshake_failures_total{listener="picker"'))


def start_envoy(name, gatewayd_config, listen_port, picker_port, flags):
    yaml = os.path.join(ARGS.work, f"{name}.yaml")
    with open(yaml, "w") as out:
        subprocess.run([ARGS.gatewayd, "envoy-config", "--listen", f"127.0.0.1:{listen_port}",
                        "--picker", f"127.0.0.1:{picker_port}", "--config", gatewayd_config, *flags],
                       stdout=out, check=True)
    envoy = Proc(name, [ARGS.envoy, "-c", yaml, "--disable-hot-restart", "-l", "warning",
                        "--concurrency", "1"])
    wait_port(listen_port, name, proc=envoy)
    return envoy


@check("picker-mtls")
def picker_mtls(fleet):
    path = make_certificates(os.path.join(ARGS.work, "certificates"))
    picker_port, control_port, data_port, trusted_port, anonymous_port = free_ports(5)
    workers = "".join(f'\n[[workers]]\nname = "{n}"\nurl = "{u}"\n' for n, u in zip(fleet.names, fleet.urls))

    def config(name, client_ca):
        file = os.path.join(ARGS.work, name)
        with open(file, "w") as f:
            f.write(f"""[server]
listen = "127.0.0.1:{data_port}"
control_listen = "127.0.0.1:{control_port}"
data_plane = false
shutdown_grace_ms = 1000

[picker]
listen = "127.0.0.1:{picker_port}"

[picker.tls]
cert_file = "{path('picker.crt')}"
key_file = "{path('picker.key')}"
client_ca_file = "{client_ca}"
{workers}""")
        return file

    mutual = config("gatewayd-mtls.toml", path("ca.crt"))
    # The same picker as Envoy would see it without mutual TLS: the bootstrap then verifies the
    # picker but has no client certificate to present.
    server_only = config("gatewayd-server-tls.toml", "")
    gatewayd = Proc("gatewayd-mtls", [ARGS.gatewayd, "--config", mutual])
    wait_port(picker_port, "the TLS picker", proc=gatewayd)
    wait_port(control_port, "the TLS picker's control plane", proc=gatewayd)
    trusted = start_envoy("envoy-mtls", mutual, trusted_port, picker_port, [
        "--picker-ca-file", path("ca.crt"), "--picker-client-cert-file", path("envoy.crt"),
        "--picker-client-key-file", path("envoy.key")])
    anonymous = start_envoy("envoy-anonymous", server_only, anonymous_port, picker_port,
                            ["--picker-ca-file", path("ca.crt")])
    try:
        deadline = time.time() + 30
        served = {}
        while sum(served.values()) < 20:
            body, headers = chat(f"mtls-{len(served)}-{sum(served.values())}", max_tokens=2)
            status, got, payload = request(trusted_port, "/v1/chat/completions", "POST", body, headers)
            if status == 200:
                served[got["x-bch-worker"]] = served.get(got["x-bch-worker"], 0) + 1
            else:
                # Workers join once their first probe passed; until then the picker says so.
                assert time.time() < deadline, (status, payload[:200])
                time.sleep(0.1)
        failures_before = picker_handshake_failures(control_port)
        body, headers = chat("anonymous")
        status, got, payload = request(anonymous_port, "/v1/chat/completions", "POST", body, headers)
        assert_openai_error(status, got, payload, 503, "picker_unavailable")
        assert picker_handshake_failures(control_port) > failures_before, "the refused handshake is counted"
        _, _, listing = request(control_port, "/admin/workers")
        loads = {w["name"]: w["active"] for w in json.loads(listing)["workers"]}
        assert sum(loads.values()) == 0, loads
        return f"with Envoy's client certificate 20 requests routed ({served}); without it 503 picker_unavailable"
    finally:
        for proc in (anonymous, trusted, gatewayd):
            proc.stop()


def https_get(port, server_name, path, ca_file, client=None):
    """GET `path` from an https worker on 127.0.0.1:`port`, verified against `ca_file` for
    `server_name` (SNI too), presenting `client` (cert, key) if given: (status, body bytes)."""
    context = ssl.create_default_context(cafile=ca_file)
    if client is not None:
        context.load_cert_chain(*client)
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                             server_hostname=server_name) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nhost: {server_name}\r\nconnection: close\r\n\r\n".encode())
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def worker_requests(port, server_name, ca_file, client):
    """The inference requests an https worker received (its own `bch_sim:requests_total`)."""
    _, body = https_get(port, server_name, "/metrics", ca_file, client)
    for line in body.decode().splitlines():
        if line.startswith("bch_sim:requests_total "):
            return int(float(line.split()[-1]))
    raise AssertionError(f"no bch_sim:requests_total on the worker at {port}")


def envoy_stat(admin_port, name):
    _, _, body = request(admin_port, f"/stats?filter=^{re.escape(name)}$")
    for line in body.decode().splitlines():
        if line.startswith(name + ": "):
            return int(line.split()[-1])
    return 0


@check("https-workers")
def https_workers(fleet):
    folder = os.path.join(ARGS.work, "worker-certificates")
    make_ca(folder, "ca")
    make_ca(folder, "rogue-ca")

    def path(name):
        return os.path.join(folder, name)

    names = ["h0", "h1", "h2"]
    # Every worker is addressed by IP (all are 127.0.0.1) and has its own server_name, the only
    # name its certificate carries: Envoy must send and verify each worker's own name.
    server_names = {n: f"{n}.workers.bch.test" for n in names}
    for name in names:
        issue(folder, "ca", name, f"subjectAltName=DNS:{server_names[name]}\nextendedKeyUsage=serverAuth")
    issue(folder, "ca", "gateway", "subjectAltName=DNS:gateway\nextendedKeyUsage=clientAuth")
    issue(folder, "rogue-ca", "rogue", f"subjectAltName=DNS:{server_names['h2']}\nextendedKeyUsage=serverAuth")
    client = (path("gateway.crt"), path("gateway.key"))
    picker_port, control_port, data_port, envoy_port, admin_port, *ports = free_ports(8)
    urls = [f"https://127.0.0.1:{p}" for p in ports]
    workers = {}

    def start_worker(i, certificate):
        workers[i] = Proc(f"https-worker-{i}-{certificate}", [
            ARGS.drill, "workers", "--count", "1", "--base-port", str(ports[i]), "--time-scale", "1",
            "--decode-base-ms", "1", "--tls-cert", path(f"{certificate}.crt"),
            "--tls-key", path(f"{certificate}.key"), "--client-ca", path("ca.crt")])
        wait_port(ports[i], f"https worker {i}", proc=workers[i])

    config = os.path.join(ARGS.work, "gatewayd-https-workers.toml")
    with open(config, "w") as f:
        f.write(f"""[server]
listen = "127.0.0.1:{data_port}"
control_listen = "127.0.0.1:{control_port}"
data_plane = false
shutdown_grace_ms = 1000

[picker]
listen = "127.0.0.1:{picker_port}"
fallbacks = 2

[health]
# One probe at the start: the rogue check swaps a worker's certificate behind the prober's back.
interval_ms = 600000

[upstream.tls]
ca_file = "{path('ca.crt')}"
client_cert_file = "{client[0]}"
client_key_file = "{client[1]}"
""")
        for name, url in zip(names, urls):
            f.write(f'\n[[workers]]\nname = "{name}"\nurl = "{url}"\nserver_name = "{server_names[name]}"\n')
    for i, name in enumerate(names):
        start_worker(i, name)
    gatewayd = Proc("gatewayd-https-workers", [ARGS.gatewayd, "--config", config])
    envoy = None
    try:
        wait_port(picker_port, "the picker", proc=gatewayd)
        wait_port(control_port, "the control plane", proc=gatewayd)
        envoy = start_envoy("envoy-https-workers", config, envoy_port, picker_port,
                            ["--admin", f"127.0.0.1:{admin_port}"])

        # The workers require a client certificate: straight to one without it is refused.
        try:
            status, _ = https_get(ports[0], server_names["h0"], "/health", path("ca.crt"))
            raise AssertionError(f"a worker answered {status} to a client without a certificate")
        except (ssl.SSLError, ConnectionError):
            pass
        assert https_get(ports[0], server_names["h0"], "/health", path("ca.crt"), client)[0] == 200

        deadline = time.time() + 30
        while True:
            status, got, listing = request(control_port, "/admin/workers")
            if all(w["healthy"] for w in json.loads(listing)["workers"]):
                break
            assert time.time() < deadline, f"the https workers never passed their probe: {listing[:500]!r}"
            time.sleep(0.1)

        before = [worker_requests(p, server_names[n], path("ca.crt"), client) for n, p in zip(names, ports)]
        keys = [f"https-{i}" for i in range(30)]
        expected = [a["worker"] for a in explain(urls, keys)]
        for key, want in zip(keys, expected):
            body, headers = chat(key, max_tokens=2)
            status, got, payload = request(envoy_port, "/v1/chat/completions", "POST", body, headers)
            assert status == 200, (key, status, payload[:300])
            assert urls[names.index(got["x-bch-worker"])] == want, (key, got["x-bch-worker"], want)
        after = [worker_requests(p, server_names[n], path("ca.crt"), client) for n, p in zip(names, ports)]
        served = [a - b for a, b in zip(after, before)]
        assert served == [expected.count(u) for u in urls], (served, expected)
        assert envoy_stat(admin_port, "cluster.bch_workers.ssl.handshake") >= len(names)
        assert envoy_stat(admin_port, "cluster.bch_workers.ssl.versions.TLSv1.3") >= len(names)

        # h2's certificate replaced by one from another CA, with the same name, behind the
        # prober's back: Envoy refuses it (a verification failure, not a plain connection), and
        # the target-worker request fails rather than move to another worker.
        workers[2].stop()
        start_worker(2, "rogue")
        verify_failures = envoy_stat(admin_port, "cluster.bch_workers.ssl.fail_verify_error")
        body, headers = chat(extra={"x-smg-target-worker": "h2"})
        status, got, payload = request(envoy_port, "/v1/chat/completions", "POST", body, headers)
        assert status == 503 and got.get("x-bch-worker") == "h2", (status, got, payload[:300])
        assert envoy_stat(admin_port, "cluster.bch_workers.ssl.fail_verify_error") > verify_failures
        rogue_requests = worker_requests(ports[2], server_names["h2"], path("rogue-ca.crt"), client)
        assert rogue_requests == 0, rogue_requests
        others = [worker_requests(p, server_names[n], path("ca.crt"), client) for n, p in zip(names[:2], ports)]
        assert others == after[:2], ("the request moved to another worker", others, after)
        deadline = time.time() + 10
        while True:
            _, _, listing = request(control_port, "/admin/workers")
            loads = {w["name"]: w["active"] for w in json.loads(listing)["workers"]}
            if sum(loads.values()) == 0:
                break
            assert time.time() < deadline, loads
            time.sleep(0.01)
        return (f"30 keyed requests over mutual TLS served by the picked workers ({served}); a worker "
                f"refuses a client without a certificate; a rogue certificate: Envoy's 503, verification failed")
    finally:
        for proc in [envoy, gatewayd, *workers.values()]:
            if proc is not None:
                proc.stop()


@check("empty-fleet")
def empty_fleet(fleet):
    for name in list(fleet.workers_now()):
        status, _, body = request(fleet.control_port, f"/admin/workers/{name}", "DELETE")
        assert status == 200, body
    body, headers = chat("anyone")
    status, got, payload = request(fleet.envoy_port, "/v1/chat/completions", "POST", body, headers)
    assert_openai_error(status, got, payload, 503, "no_healthy_workers")
    assert got["x-bch-branch"] == "no_healthy_workers", got


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    for flag in ("--envoy", "--gatewayd", "--drill", "--work", "--summary"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--only", nargs="*", help="run only these checks (by name: landing, picker-mtls, ...)")
    ARGS = parser.parse_args()
    try:
        fleet = Fleet()
    except Exception as error:
        print(f"FAIL setup: {error}", flush=True)
        RESULTS.append(("setup", False))
        fleet = None
    if fleet is not None:
        for run in (landing, correlation, sse, aborts, burst, worker_kill, target_miss, overload, picker_kill,
                    picker_mtls, https_workers, empty_fleet):
            if not ARGS.only or run.check_name in ARGS.only:
                run(fleet)
    for proc in reversed(PROCS):
        proc.stop()
    passed = sum(1 for _, ok in RESULTS if ok)
    failed = len(RESULTS) - passed
    line = f"envoy: {passed} passed, {failed} failed"
    with open(ARGS.summary, "w") as f:
        f.write(line + "\n")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
