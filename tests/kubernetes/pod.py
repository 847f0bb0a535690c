"""The pod check: the gateway container of a rendered Deployment run on this machine, as the
manifest's runAsUser, against simulated workers (bch-drill) behind the discovery name, which dnsmasq
serves; the kubelet's probes, a request served by a discovered worker, and a SIGTERM in the middle
of a stream (checks.py's "pod" checks; its docstring says what they prove). Pod also runs
`gatewayd check-config` for checks.py. Processes, dnsmasq, the workers, Pod, a minimal gRPC health
client and the streams are here.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from http.client import HTTPConnection
from pathlib import Path

from checking import CheckFailed, expect
from manifests import container, dockerfile_user_and_ports, find, generated

# A test worker's reply that gatewayd did not make: bch-drill's simulated completion.
COMPLETION_OBJECT = "chat.completion"
# Tokens of the stream a SIGTERM interrupts: with the workers' --time-scale 5, a few seconds.
STREAM_TOKENS = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, predicate, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def http(method: str, url: str, headers: dict | None = None, body: bytes | None = None):
    """(status, headers, body) of one request; a refused connection answers (None, {}, b'')."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()
    except (TimeoutError, urllib.error.URLError, ConnectionError):
        return None, {}, b""


def tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Processes:
    """Every process a check starts, stopped (and reaped) at its end."""

    def __init__(self):
        self.children: list[subprocess.Popen] = []
        self.logs = []

    def start(self, argv: list[str], log: Path, **kwargs) -> subprocess.Popen:
        """Starts `argv` with its stdout and stderr in the file `log`."""
        output = log.open("w")
        self.logs.append(output)
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, **kwargs
        )
        self.children.append(child)
        return child

    def stop(self):
        for child in reversed(self.children):
            if child.poll() is None:
                child.kill()
            child.wait()
        for output in self.logs:
            output.close()


def start_dnsmasq(procs: Processes, dnsmasq: str, work: Path, srv: str, workers) -> int:
    """dnsmasq on a free loopback port: `srv` -> one target per worker (name, address, port)."""
    zone = srv.rstrip(".").split(".", 2)[2]  # llm-workers.NAMESPACE.svc.cluster.local
    for _ in range(20):
        port = free_udp_port()
        lines = [
            f"port={port}",
            "listen-address=127.0.0.1",
            "bind-interfaces",
            "no-resolv",
            "no-hosts",
            "local=/cluster.local/",
            "local-ttl=1",
            "log-facility=-",
            "pid-file=",
        ]
        if os.geteuid() == 0:
            lines.append("user=root")
        for name, address, worker_port in workers:
            lines.append(f"srv-host={srv.rstrip('.')},{name}.{zone},{worker_port},0,10")
            lines.append(f"host-record={name}.{zone},{address}")
        conf = work / "dnsmasq.conf"
        conf.write_text("\n".join(lines) + "\n")
        log = work / "dnsmasq.log"
        child = procs.start([dnsmasq, "-k", f"--conf-file={conf}"], log)
        started = wait_until(
            "dnsmasq to start",
            lambda child=child, log=log: (
                child.poll() is not None or "started, version" in log.read_text()
            ),
            timeout=10,
        )
        if started and child.poll() is None:
            return port
    raise CheckFailed(f"dnsmasq did not start: {(work / 'dnsmasq.log').read_text()}")


def worker_pods(port: int) -> list[tuple[str, str, int]]:
    """Three simulated worker pods, (name, address, port): 127.0.0.2-4, all on the Service's port,
    named as CoreDNS names a Deployment's pods in a headless Service's SRV targets."""
    addresses = [f"127.0.0.{index + 2}" for index in range(3)]
    return [(address.replace(".", "-"), address, port) for address in addresses]


def start_workers(procs: Processes, drill: str, work: Path, workers) -> None:
    """Starts the simulated workers of `worker_pods` and waits until each answers /health."""
    for index, (_, address, port) in enumerate(workers):
        procs.start(
            [
                drill,
                "workers",
                "--count",
                "1",
                "--host",
                address,
                "--base-port",
                str(port),
                "--time-scale",
                "5",
            ],
            work / f"worker-{index}.log",
        )
    for _, address, worker_port in workers:
        wait_until(
            f"worker {address}:{worker_port}",
            lambda url=f"http://{address}:{worker_port}/health": http("GET", url)[0] == 200,
        )


class Pod:
    """The gateway container of a rendered Deployment, run on this machine."""

    def __init__(self, docs: list[dict], work: Path, gatewayd: str, resolver: int):
        self.docs = docs
        self.work = work
        # What the pod's user reads (the binary, the mounts) lives outside the checkout, whose
        # parent directories that user may not be allowed to enter (a clone under /root).
        self.root = Path(tempfile.mkdtemp(prefix="bch-kubernetes-pod-"))
        os.chmod(self.root, 0o755)
        deployment = find(docs, "Deployment", "gatewayd")
        self.pod_spec = deployment["spec"]["template"]["spec"]
        self.container = container(deployment)
        self.user = self.pod_spec["securityContext"]["runAsUser"]
        self.group = self.pod_spec["securityContext"].get("runAsGroup", self.user)
        # Each container port's wildcard listen address becomes a free loopback port.
        self.ports = {p["containerPort"]: free_port() for p in self.container["ports"]}
        self.named = {p["name"]: self.ports[p["containerPort"]] for p in self.container["ports"]}
        self.admin_token = secrets.token_urlsafe(24)
        self.metrics_token = secrets.token_urlsafe(24)
        self.mounts = self.materialise_volumes(resolver)
        _, _, entrypoint = dockerfile_user_and_ports()
        # The image's binary is the one cargo built; copied where the pod's user may run it.
        binary = self.root / "bin" / Path(entrypoint[0]).name
        binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(gatewayd, binary)
        expect("command" not in self.container, "the container overrides the image's ENTRYPOINT")
        self.argv = (
            [str(binary)]
            + entrypoint[1:]
            + [self.substitute(a) for a in self.container.get("args", [])]
        )
        self.env = {"PATH": "/usr/bin:/bin"}
        for variable in self.container.get("env", []):
            expect("value" in variable, f"env {variable['name']} is not a plain value")
            self.env[variable["name"]] = self.substitute(variable["value"])
        self.process: subprocess.Popen | None = None

    def substitute(self, text: str) -> str:
        for mount_path, directory in self.mounts.items():
            text = text.replace(mount_path, str(directory))
        for container_port, port in self.ports.items():
            text = re.sub(rf"(0\.0\.0\.0|\[::\]):{container_port}\b", f"127.0.0.1:{port}", text)
        return text

    def materialise_volumes(self, resolver: int) -> dict[str, Path]:
        """Each mount as a directory: ConfigMap keys as files (the TOML substituted), the tokens
        Secret with test tokens, owned by root and readable by the pod's group as defaultMode and
        fsGroup make them."""
        volumes = {v["name"]: v for v in self.pod_spec["volumes"]}
        mounts = {}
        for mount in self.container["volumeMounts"]:
            directory = self.root / "mounts" / mount["name"]
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory.parent, 0o755)
            os.chmod(directory, 0o755)
            mounts[mount["mountPath"]] = directory
        for mount in self.container["volumeMounts"]:
            directory = mounts[mount["mountPath"]]
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                data = find(self.docs, "ConfigMap", volume["configMap"]["name"])["data"]
                for key, text in data.items():
                    if key.endswith(".toml"):
                        text = self.substitute_config(text, mounts, resolver)
                    (directory / key).write_text(text)
                    os.chmod(directory / key, 0o644)
            elif "secret" in volume:
                secret = find(self.docs, "Secret", volume["secret"]["secretName"])
                values = {"admin.token": self.admin_token, "metrics.token": self.metrics_token}
                for key in secret["data"]:
                    expect(key in values, f"the test has no value for the Secret's key {key}")
                    path = directory / key
                    path.write_text(values[key] + "\n")
                    mode = volume["secret"].get("defaultMode", 0o644)
                    os.chmod(path, mode)
                    if os.geteuid() == 0:
                        os.chown(path, 0, self.pod_spec["securityContext"].get("fsGroup", 0))
            else:
                raise CheckFailed(f"volume {mount['name']} is of a kind the test cannot mount")
        return mounts

    def substitute_config(self, text: str, mounts: dict[str, Path], resolver: int) -> str:
        for mount_path, directory in mounts.items():
            text = text.replace(f'"{mount_path}/', f'"{directory}/')
        for container_port, port in self.ports.items():
            text = re.sub(rf'"(0\.0\.0\.0|\[::\]):{container_port}"', f'"127.0.0.1:{port}"', text)
        # The cluster's DNS is dnsmasq here.
        text = re.sub(r"(?m)^(dns = .*)$", rf'\1\nresolver = "127.0.0.1:{resolver}"', text)
        return text

    def config_file(self) -> Path:
        return next(Path(a) for a in self.argv if a.endswith(".toml"))

    def as_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            expect(os.environ.get("CI") != "true", "CI runs as root and must drop to runAsUser")
            print(f"  note: not root, so gatewayd runs as uid {os.geteuid()}, not {self.user}")
            return argv
        return [
            "setpriv",
            f"--reuid={self.user}",
            f"--regid={self.group}",
            f"--groups={self.pod_spec['securityContext'].get('fsGroup', self.group)}",
            "--",
        ] + argv

    def start(self, procs: Processes):
        self.log = self.work / "gatewayd.log"
        self.process = procs.start(self.as_user(self.argv), self.log, env=self.env)

    def probe(self, probe: dict) -> bool:
        expect(self.process.poll() is None, f"gatewayd exited: {self.log.read_text()[-2000:]}")
        if "httpGet" in probe:
            port = self.port_of(probe["httpGet"]["port"])
            return http("GET", f"http://127.0.0.1:{port}{probe['httpGet']['path']}")[0] == 200
        if "tcpSocket" in probe:
            return tcp_open(self.port_of(probe["tcpSocket"]["port"]))
        if "grpc" in probe:
            port = self.port_of(probe["grpc"]["port"])
            return grpc_health(port, probe["grpc"].get("service", "")) == GRPC_SERVING
        raise CheckFailed(f"a probe the test cannot run: {probe}")

    def port_of(self, port) -> int:
        return self.named[port] if isinstance(port, str) else self.ports[port]

    def remove_files(self):
        """Removes the binary and the mounts (the log stays in the work directory)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def control(self, path: str, token: str):
        port = self.named["control"]
        return http("GET", f"http://127.0.0.1:{port}{path}", {"Authorization": f"Bearer {token}"})


def run_pod(docs, args, work: Path, mode: str) -> None:
    procs = Processes()
    pod = None
    try:
        workers_service = find(docs, "Service", "llm-workers")
        worker_port = workers_service["spec"]["ports"][0]["targetPort"]
        config_map = generated(docs, "ConfigMap", "gatewayd-config")
        srv = tomllib.loads(config_map["data"]["gatewayd.toml"])["discovery"][0]["dns"]
        workers = worker_pods(worker_port)
        names = {f"{name}.{srv.rstrip('.').split('.', 2)[2]}" for name, _, _ in workers}
        resolver = start_dnsmasq(procs, args.dnsmasq, work, srv, workers)
        pod = Pod(docs, work, args.gatewayd, resolver)
        pod.start(procs)
        # A fleet outage first: every worker published, none running. The replica stays alive
        # (the liveness probe passes) and unready: the Service (or, for the picker, Envoy's
        # InferencePool) sends it nothing it could only refuse.
        wait_until("every published worker to be discovered", lambda: listed_workers(pod) == names)
        expect(
            pod.probe(pod.container["livenessProbe"]), "the liveness probe fails without workers"
        )
        expect(
            not pod.probe(pod.container["readinessProbe"]),
            "the readiness probe passes while no worker is up",
        )
        start_workers(procs, args.drill, work, workers)
        # The kubelet's view: ready once a worker passed its first probe.
        wait_until(
            "the readiness probe to pass", lambda: pod.probe(pod.container["readinessProbe"])
        )
        expect(pod.probe(pod.container["livenessProbe"]), "the liveness probe fails")
        status = Path(f"/proc/{gatewayd_pid(pod.process)}/status").read_text()
        uid = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE).group(1)
        if os.geteuid() == 0:
            expect(int(uid) == pod.user, f"gatewayd runs as uid {uid}, not {pod.user}")
        # Every worker DNS publishes under the discovery name is a healthy member.
        def members():
            code, _, body = pod.control("/admin/workers", pod.admin_token)
            expect(code == 200, f"GET /admin/workers answered {code}")
            listed = json.loads(body)["workers"]
            healthy = {w["name"] for w in listed if w.get("healthy")}
            return healthy == names and listed

        listed = wait_until("every discovered worker to be healthy", members)
        sources = {w["source"] for w in listed}
        expect(sources == {f"dns:{srv}"}, f"worker sources {sources}")
        # The metrics token opens /metrics and nothing else; the admin token everything.
        expect(
            pod.control("/metrics", pod.metrics_token)[0] == 200, "/metrics with the metrics token"
        )
        expect(
            pod.control("/admin/workers", pod.metrics_token)[0] == 401,
            "the metrics token opens the admin API",
        )
        if mode == "base":
            served_by_a_worker(pod, names)
            stop_during_a_stream(pod)
        else:
            speaks_http2(pod.named["picker"])
            # The kubelet's SIGTERM (after preStop): gatewayd stops on its own.
            os.kill(gatewayd_pid(pod.process), signal.SIGTERM)
            stopped(pod)
    finally:
        procs.stop()
        if pod is not None:
            pod.remove_files()


def listed_workers(pod: Pod) -> set[str]:
    """The names of the workers the control plane lists (GET /admin/workers); none while it does
    not accept connections yet."""
    code, _, body = pod.control("/admin/workers", pod.admin_token)
    if code is None:
        return set()
    expect(code == 200, f"GET /admin/workers answered {code}")
    return {w["name"] for w in json.loads(body)["workers"]}


def speaks_http2(port: int) -> None:
    """The picker's port answers an HTTP/2 connection preface with a SETTINGS frame, as the
    Service's appProtocol http2 says (Envoy's ext_proc is gRPC over plaintext HTTP/2)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        empty_settings = bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])
        connection.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + empty_settings)
        header = b""
        while len(header) < 9:
            chunk = connection.recv(9 - len(header))
            expect(chunk, "the picker closed the connection instead of answering HTTP/2")
            header += chunk
    expect(header[3] == 0x4, f"the picker's first frame is of type {header[3]}, not SETTINGS")


# grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING; the kubelet's grpc probe passes on it
# alone.
GRPC_SERVING = 1


def grpc_health(port: int, service: str) -> int | None:
    """The status `grpc.health.v1.Health/Check` answers for `service` on plaintext HTTP/2, as the
    kubelet's grpc probe asks it; None when there is no answer message (refused, an error
    status, a closed connection). A minimal client: one stream, headers as HPACK literals."""

    def literal(name: str, value: str) -> bytes:
        # Literal header field without indexing, new name, no Huffman (lengths stay under 127).
        return bytes([0, len(name)]) + name.encode() + bytes([len(value)]) + value.encode()

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    headers = b"".join(
        literal(name, value)
        for name, value in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/grpc.health.v1.Health/Check"),
            (":authority", f"127.0.0.1:{port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )
    # HealthCheckRequest { service = 1 }, behind gRPC's uncompressed length prefix.
    request = (bytes([0x0A, len(service)]) + service.encode()) if service else b""
    message = bytes([0]) + len(request).to_bytes(4, "big") + request
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            connection.sendall(
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                + frame(0x4, 0, 0, b"")
                + frame(0x1, 0x4, 1, headers)  # HEADERS, END_HEADERS
                + frame(0x0, 0x1, 1, message)  # DATA, END_STREAM
            )
            buffered = b""

            def read(count: int) -> bytes:
                nonlocal buffered
                while len(buffered) < count:
                    chunk = connection.recv(65536)
                    if not chunk:
                        raise ConnectionError("closed")
                    buffered += chunk
                taken, buffered = buffered[:count], buffered[count:]
                return taken

            while True:
                header = read(9)
                length, kind, flags = int.from_bytes(header[:3], "big"), header[3], header[4]
                stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
                payload = read(length)
                if kind == 0x4 and not flags & 0x1:
                    connection.sendall(frame(0x4, 0x1, 0, b""))  # SETTINGS ACK
                elif kind == 0x0 and stream == 1 and len(payload) >= 5:
                    # HealthCheckResponse { status = 1 (varint) }; absent means UNKNOWN (0).
                    body = payload[5:]
                    return body[1] if len(body) >= 2 and body[0] == 0x08 else 0
                elif (kind == 0x1 and stream == 1 and flags & 0x1) or kind in (0x3, 0x7):
                    return None  # trailers only (an error status), RST_STREAM or GOAWAY
    except (OSError, ConnectionError):
        return None


def chat_request(max_tokens: int, stream: bool) -> bytes:
    return json.dumps(
        {
            "model": "sim",
            "max_tokens": max_tokens,
            "stream": stream,
            "messages": [{"role": "user", "content": "hello"}],
        }
    ).encode()


def served_by_a_worker(pod: Pod, names: set[str]) -> None:
    """A keyed request through the data plane is answered by one of the discovered workers."""
    code, headers, answer = http(
        "POST",
        f"http://127.0.0.1:{pod.named['data']}/v1/chat/completions",
        {"content-type": "application/json", "x-smg-routing-key": "session-42"},
        chat_request(4, stream=False),
    )
    expect(code == 200, f"the request answered {code}: {answer[:300]!r}")
    worker = {k.lower(): v for k, v in headers.items()}.get("x-bch-worker")
    expect(worker in names, f"x-bch-worker {worker!r} is not a discovered worker {sorted(names)}")
    expect(
        json.loads(answer).get("object") == COMPLETION_OBJECT,
        f"the answer is not a worker's completion: {answer[:300]!r}",
    )


def stop_during_a_stream(pod: Pod) -> None:
    """The kubelet's SIGTERM (after the preStop pause) in the middle of a streamed generation: the
    listener closes at once, the stream runs to its end under the manifest's shutdown_grace_ms,
    and only then does gatewayd exit, with 0. This is what a rollout does to every replica."""
    first_event = threading.Event()
    result: dict = {}

    def stream():
        connection = HTTPConnection("127.0.0.1", pod.named["data"], timeout=30)
        try:
            connection.request(
                "POST",
                "/v1/chat/completions",
                chat_request(STREAM_TOKENS, stream=True),
                {"content-type": "application/json", "x-smg-routing-key": "session-43"},
            )
            response = connection.getresponse()
            result["status"] = response.status
            body = response.readline()
            first_event.set()
            body += response.read()
            result["body"] = body
            result["ended"] = time.monotonic()
        except Exception as error:  # noqa: BLE001 - reported by the check below
            result["error"] = repr(error)
        finally:
            first_event.set()
            connection.close()

    reader = threading.Thread(target=stream)
    reader.start()
    expect(first_event.wait(20), "no first event of the stream")
    expect("error" not in result, f"the stream failed before SIGTERM: {result.get('error')}")
    sent = time.monotonic()
    os.kill(gatewayd_pid(pod.process), signal.SIGTERM)
    wait_until(
        "the data plane to stop accepting connections",
        lambda: not tcp_open(pod.named["data"]),
        timeout=10,
    )
    expect(pod.process.poll() is None, "gatewayd exited with a stream in flight")
    reader.join(30)
    expect("error" not in result, f"the stream broke after SIGTERM: {result.get('error')}")
    expect(result.get("status") == 200, f"the stream answered {result.get('status')}")
    expect(
        result.get("body", b"").rstrip().endswith(b"data: [DONE]"),
        f"the stream did not run to its end: {result.get('body', b'')[-300:]!r}",
    )
    expect(result["ended"] > sent, "the stream ended before SIGTERM: the check proves nothing")
    stopped(pod)


def stopped(pod: Pod) -> None:
    try:
        code = pod.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise CheckFailed("gatewayd did not stop within 30 s of SIGTERM") from None
    expect(code == 0, f"gatewayd exited {code} on SIGTERM: {pod.log.read_text()[-2000:]}")


def gatewayd_pid(process: subprocess.Popen) -> int:
    """gatewayd's pid: setpriv execs it, so it is the child's own."""
    return process.pid
