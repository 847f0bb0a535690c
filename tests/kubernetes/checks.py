"""The Kubernetes manifests and the Dockerfile, checked without a cluster or a container engine.

run.sh calls this with the virtualenv's Python (PyYAML, kubernetes-validate, hadolint). Each check
prints `PASS name` or `FAIL name: why`; the last line is `kubernetes: N passed, M failed`.

- render: `kubectl kustomize` of deploy/kubernetes, overlays/picker, and the overlay
  docs/kubernetes.md has an operator write (image, tokens; taken from the page) with
  components/podmonitor;
- validate: every built-in resource against the Kubernetes JSON schemas of the oldest and the
  newest version the manifests support, strictly (an unknown field fails); custom resources
  (NOT_VALIDATED) are not validated against a schema, only checked for what they reference;
- references: Services, the PodDisruptionBudget and the PodMonitor select the gateway's pods and name
  its ports; volumes name the generated ConfigMap and Secret; the pods run as the Dockerfile's user,
  meet Pod Security "restricted" and expose its ports; liveness is not on the data plane; the grace
  period covers the preStop pause and shutdown_grace_ms; rollout, disruption budget and the control
  Service keep replicas reachable; the discovery name is the workers Service's SRV name;
- docs: every Deployment in a ```yaml block of docs/*.md probes liveness as the base does;
- the Dockerfile: hadolint, and a build stage that names the workspace's packages and binaries;
- `gatewayd check-config` on the ConfigMap's gatewayd.toml;
- the pod, for the base and the picker overlay: the container's command line (the Dockerfile's
  ENTRYPOINT and the manifest's args) and environment run as the manifest's runAsUser against
  simulated workers behind the discovery name, served by dnsmasq. Only what a pod gets from the
  cluster is substituted: mounts become directories (the ConfigMap's file, test tokens), the
  container ports' wildcard listen addresses become free loopback ports, and each [[discovery]]
  entry gets dnsmasq's address as its resolver (the pod's resolv.conf names the cluster's DNS).
  Before the workers start, liveness passes and (with a data plane) readiness fails; then the
  probes pass, a request is served by a discovered worker, and a SIGTERM in the middle of a
  stream lets it finish before gatewayd exits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import traceback
import urllib.error
import urllib.request
from http.client import HTTPConnection
from pathlib import Path

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
# The oldest Kubernetes the manifests are for (the preStop sleep action is on by default from
# 1.30) and the newest the validator ships.
KUBERNETES_VERSIONS = ["1.30.0", "1.37.0"]
# Custom resources: their CRDs are not part of Kubernetes and no schema of theirs is vendored here,
# so they are checked for what they reference only.
NOT_VALIDATED = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("inference.networking.k8s.io/v1", "InferencePool"),
}
# A test worker's reply that gatewayd did not make: bch-drill's simulated completion.
COMPLETION_OBJECT = "chat.completion"
# Tokens of the stream a SIGTERM interrupts: with the workers' --time-scale 5, a few seconds.
STREAM_TOKENS = 40

RESULTS: list[tuple[str, str | None]] = []


class CheckFailed(Exception):
    pass


def expect(condition: bool, why: str) -> None:
    if not condition:
        raise CheckFailed(why)


def run_check(name: str, function, *args) -> bool:
    """Runs one named check, printing and recording PASS or FAIL; answers whether it passed."""
    try:
        function(*args)
    except CheckFailed as failure:
        RESULTS.append((name, str(failure)))
        print(f"FAIL {name}: {failure}", flush=True)
        return False
    except Exception:  # noqa: BLE001 - a crash is this check's failure, not the run's
        RESULTS.append((name, traceback.format_exc()))
        print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
        return False
    RESULTS.append((name, None))
    print(f"PASS {name}", flush=True)
    return True


# ------------------------------------------------------------------------------------ rendering


def render(kubectl: str, directory: Path) -> list[dict]:
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    expect(done.returncode == 0, f"kubectl kustomize {directory} failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def operator_overlay(work: Path) -> Path:
    """The overlay docs/kubernetes.md has an operator write (image, tokens), as the page's own
    `cat > my-fleet/kustomization.yaml` block says it, with components/podmonitor added as its
    Monitoring section says. The overlay lives in a scratch directory, so the base's path in it
    is rewritten from the checkout's root to there."""
    page = (ROOT / "docs" / "kubernetes.md").read_text()
    block = re.search(
        r"^cat > my-fleet/kustomization\.yaml <<'EOF'\n(.*?)^EOF$", page, re.MULTILINE | re.DOTALL
    )
    expect(block is not None, "docs/kubernetes.md has no `cat > my-fleet/kustomization.yaml`")
    directory = work / "my-fleet"
    directory.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(DEPLOY / "base", directory)
    component = os.path.relpath(DEPLOY / "components" / "podmonitor", directory)
    text = block.group(1)
    expect("  - ../deploy/kubernetes/base " in text, "the page's overlay names no base")
    text = text.replace("  - ../deploy/kubernetes/base ", f"  - {base} ", 1)
    text += f"components:\n  - {component}\n"
    for token in ("admin.token", "metrics.token"):
        (directory / token).write_text(secrets.token_urlsafe(24) + "\n")
    (directory / "kustomization.yaml").write_text(text)
    return directory


def find(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    expect(len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}")
    return found[0]


def generated(docs: list[dict], kind: str, prefix: str) -> dict:
    """The ConfigMap or Secret kustomize generated from `prefix` (its name carries a hash)."""
    found = [
        d
        for d in docs
        if d["kind"] == kind and re.fullmatch(rf"{prefix}-[a-z0-9]{{10}}", d["metadata"]["name"])
    ]
    expect(len(found) == 1, f"expected one generated {kind} {prefix}-HASH, found {len(found)}")
    return found[0]


# ----------------------------------------------------------------------------------- validation


def validate(docs: list[dict]) -> list[str]:
    """Validates every built-in resource; answers the custom resources left unvalidated."""
    skipped = []
    for doc in docs:
        what = f"{doc['kind']}/{doc['metadata']['name']}"
        if (doc["apiVersion"], doc["kind"]) in NOT_VALIDATED:
            skipped.append(what)
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                path = ".".join(str(p) for p in error.path)
                raise CheckFailed(f"{what} against Kubernetes {version}: {path}: {error.message}")
            except kubernetes_validate.SchemaNotFoundError:
                raise CheckFailed(
                    f"{what}: no Kubernetes {version} schema for {doc['apiVersion']} "
                    f"{doc['kind']} (a custom resource must be listed in NOT_VALIDATED)"
                )
    return skipped


# ----------------------------------------------------------------------------------- references


def pod_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    expect(len(containers) == 1, f"expected one container, found {len(containers)}")
    return containers[0]


def port_names(deployment: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}


def dockerfile_user_and_ports() -> tuple[int, set[int], list[str]]:
    """The runtime stage's numeric USER, its EXPOSEd ports and its ENTRYPOINT (exec form)."""
    user, ports, entrypoint = None, set(), None
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "FROM":
            user, ports, entrypoint = None, set(), None
        elif words[0] == "USER":
            user = int(words[1].split(":")[0])
        elif words[0] == "EXPOSE":
            ports |= {int(w.split("/")[0]) for w in words[1:]}
        elif words[0] == "ENTRYPOINT":
            entrypoint = json.loads(line.split(None, 1)[1])
    expect(user is not None, "the Dockerfile's last stage sets no numeric USER")
    expect(entrypoint is not None, "the Dockerfile's last stage has no exec-form ENTRYPOINT")
    return user, ports, entrypoint


def check_references(docs: list[dict], mode: str) -> None:
    deployment = find(docs, "Deployment", "gatewayd")
    labels = pod_labels(deployment)
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    ports = port_names(deployment)
    expect(selects(spec["selector"]["matchLabels"], labels), "the Deployment's selector")
    for service in (
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] != "llm-workers"
    ):
        name = service["metadata"]["name"]
        expect(
            selects(service["spec"]["selector"], labels), f"Service {name} selects no gateway pod"
        )
        for port in service["spec"]["ports"]:
            expect(
                port["targetPort"] in ports,
                f"Service {name} targets port {port['targetPort']!r}, the pod has {sorted(ports)}",
            )
    pdb = find(docs, "PodDisruptionBudget")
    expect(selects(pdb["spec"]["selector"]["matchLabels"], labels), "the PodDisruptionBudget")
    # A node drain must be able to evict a replica (a budget of none blocks it forever), also
    # when a fleet outage left every replica unready (readiness follows the workers).
    budget = pdb["spec"]
    if "maxUnavailable" in budget:
        expect(
            isinstance(budget["maxUnavailable"], int) and budget["maxUnavailable"] >= 1,
            f"the PodDisruptionBudget allows no eviction: maxUnavailable "
            f"{budget['maxUnavailable']}",
        )
    else:
        expect(
            isinstance(budget.get("minAvailable"), int)
            and budget["minAvailable"] < spec["replicas"],
            f"the PodDisruptionBudget allows no eviction of {spec['replicas']} replicas",
        )
    expect(
        budget.get("unhealthyPodEvictionPolicy") == "AlwaysAllow",
        "the PodDisruptionBudget keeps unready replicas: a fleet outage blocks node drains",
    )
    # A rollout keeps every old replica until a new one is ready.
    rolling = spec["strategy"]["rollingUpdate"]
    expect(
        spec["strategy"]["type"] == "RollingUpdate" and rolling.get("maxUnavailable") == 0,
        f"a rollout may stop an old replica before a new one is ready: {spec['strategy']}",
    )
    # The control plane's headless Service: every replica's address, the unready ones too.
    control = find(docs, "Service", "gatewayd-control")["spec"]
    expect(control.get("clusterIP") == "None", "gatewayd-control is not headless")
    expect(
        control.get("publishNotReadyAddresses") is True,
        "gatewayd-control hides unready replicas, whose control plane is needed most",
    )
    expect(
        [p["targetPort"] for p in control["ports"]] == ["control"],
        f"gatewayd-control targets {[p['targetPort'] for p in control['ports']]}, not control",
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_map = generated(docs, "ConfigMap", "gatewayd-config")
    tokens = generated(docs, "Secret", "gatewayd-tokens")
    expect(
        volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"], "config volume"
    )
    expect(volumes["tokens"]["secret"]["secretName"] == tokens["metadata"]["name"], "token volume")
    # The image's user is the pod's, and a non-root one.
    user, exposed, _ = dockerfile_user_and_ports()
    security = pod["securityContext"]
    expect(security.get("runAsNonRoot") is True, "runAsNonRoot is not set")
    expect(security.get("runAsUser") == user, f"runAsUser is not the Dockerfile's USER {user}")
    # The Pod Security Standard "restricted" (a namespace enforcing it admits the pods), and no
    # service account token: gatewayd never calls the Kubernetes API.
    hardening = container(deployment)["securityContext"]
    expect(hardening.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem is not set")
    expect(
        hardening.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false"
    )
    expect(
        hardening.get("capabilities", {}).get("drop") == ["ALL"]
        and not hardening["capabilities"].get("add"),
        f"capabilities are not drop [ALL]: {hardening.get('capabilities')}",
    )
    seccomp = hardening.get("seccompProfile") or security.get("seccompProfile") or {}
    expect(seccomp.get("type") == "RuntimeDefault", f"seccompProfile {seccomp}")
    expect(
        pod.get("automountServiceAccountToken") is False, "the pods mount a service account token"
    )
    # The environment is the manifest's (the pod check runs with exactly that): no GATEWAYD_*
    # variables for the Services gatewayd and gatewayd-picker next to the GATEWAYD_* settings.
    expect(
        pod.get("enableServiceLinks") is False,
        "Services' link variables (GATEWAYD_PORT, …) would land in gatewayd's GATEWAYD_* settings",
    )
    # Prometheus by annotation scrapes the control plane's /metrics.
    annotations = spec["template"]["metadata"].get("annotations", {})
    expect(
        annotations.get("prometheus.io/port") == str(ports["control"])
        and annotations.get("prometheus.io/path") == "/metrics",
        f"the scrape annotations do not name the control plane's /metrics: {annotations}",
    )
    expect(
        set(ports.values()) <= exposed,
        f"container ports {sorted(ports.values())} not all EXPOSEd by the Dockerfile {sorted(exposed)}",
    )
    # Liveness never on the data plane: at server.max_connections it answers every new
    # connection 503, the kubelet's probe included, and a replica that is merely saturated would
    # be restarted with every stream it carries.
    liveness = container(deployment)["livenessProbe"]
    liveness_port = next(
        (liveness[kind]["port"] for kind in ("httpGet", "tcpSocket", "grpc") if kind in liveness),
        None,
    )
    expect(
        liveness_port not in ("data", ports.get("data")),
        "the liveness probe uses the data plane, which answers 503 at max_connections",
    )
    # The kubelet's SIGKILL comes after the preStop pause and the whole of shutdown_grace_ms.
    config = tomllib.loads(config_map["data"]["gatewayd.toml"])
    grace_s = config["server"]["shutdown_grace_ms"] / 1000
    pre_stop = container(deployment)["lifecycle"]["preStop"]["sleep"]["seconds"]
    expect(
        pod["terminationGracePeriodSeconds"] > pre_stop + grace_s,
        f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} <= preStop "
        f"{pre_stop} s + shutdown_grace_ms {grace_s:.0f} s",
    )
    # The discovery name is the example workers Service's SRV name.
    workers = find(docs, "Service", "llm-workers")
    expect(workers["spec"].get("clusterIP") == "None", "the workers Service is not headless")
    namespace = workers["metadata"]["namespace"]
    srv_names = {
        f"_{p['name']}._{p.get('protocol', 'TCP').lower()}.llm-workers.{namespace}.svc.cluster.local."
        for p in workers["spec"]["ports"]
    }
    dns = [d["dns"] for d in config["discovery"]]
    expect(dns and set(dns) <= srv_names, f"[[discovery]] {dns} is not among {sorted(srv_names)}")
    expect(config["load"]["source"] == "worker_metrics", "replicas must read worker_metrics load")
    if mode == "picker":
        expect(spec["replicas"] == 1, "the picker overlay runs one replica")
        # Ready only while a worker is routable: the gRPC health service on the picker's port
        # says so; a TCP probe would be ready as soon as gatewayd listens.
        readiness = container(deployment)["readinessProbe"]
        expect(
            readiness.get("grpc", {}).get("port") == ports.get("picker"),
            f"the picker's readiness probe is not gRPC health on the picker port: {readiness}",
        )
        expect(
            not any(d["kind"] == "Service" and d["metadata"]["name"] == "gatewayd" for d in docs),
            "the picker overlay keeps the data plane's Service",
        )
        pool = find(docs, "InferencePool")
        expect(
            pool["spec"]["selector"]["matchLabels"] == workers["spec"]["selector"],
            "the InferencePool's pods are not the discovered workers Service's",
        )
        expect(
            [p["number"] for p in pool["spec"]["targetPorts"]]
            == [p["targetPort"] for p in workers["spec"]["ports"]],
            "InferencePool targetPorts",
        )
        ref = pool["spec"]["endpointPickerRef"]
        picker = find(docs, "Service", ref["name"])
        expect(
            ref["port"]["number"] in [p["port"] for p in picker["spec"]["ports"]],
            "the InferencePool's picker port is not its Service's",
        )
    else:
        expect(spec["replicas"] >= 2, "the base runs several replicas")
    for monitor in (d for d in docs if d["kind"] == "PodMonitor"):
        expect(selects(monitor["spec"]["selector"]["matchLabels"], labels), "PodMonitor selector")
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            expect(endpoint["port"] == "control", f"PodMonitor port {endpoint['port']}")
            expect(endpoint.get("path") == "/metrics", f"PodMonitor path {endpoint.get('path')}")
            credentials = endpoint["authorization"]["credentials"]
            expect(
                credentials["name"] == tokens["metadata"]["name"],
                f"PodMonitor credentials name {credentials['name']}, not the generated Secret",
            )
            expect(
                credentials["key"] in tokens["data"], f"no key {credentials['key']} in the Secret"
            )
            expect(
                config["server"]["metrics_token_file"].endswith("/" + credentials["key"]),
                "the PodMonitor's key is not gatewayd's metrics token file",
            )


# --------------------------------------------------------------------------------- the pod


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


# ------------------------------------------------------------------------------------------ main


def render_all(args, rendered: dict[str, list[dict]]) -> None:
    rendered["base"] = render(args.kubectl, DEPLOY)
    expect(
        render(args.kubectl, DEPLOY / "base") == rendered["base"],
        "deploy/kubernetes is not base/ as it is",
    )
    rendered["picker"] = render(args.kubectl, DEPLOY / "overlays" / "picker")
    rendered["operator"] = render(args.kubectl, operator_overlay(args.work))
    image = container(find(rendered["operator"], "Deployment", "gatewayd"))["image"]
    expect(
        image == "registry.internal.example/ml/gatewayd:0.1.0",
        f"the overlay's image is not used: {image}",
    )
    tokens = generated(rendered["operator"], "Secret", "gatewayd-tokens")["data"]
    expect(all(tokens.values()), "the overlay's tokens do not replace the empty placeholders")
    find(rendered["operator"], "PodMonitor", "gatewayd")


def validate_rendered(docs: list[dict]) -> None:
    skipped = validate(docs)
    if skipped:
        print(f"  not validated against a schema (custom resources): {', '.join(skipped)}")


def lint_dockerfile(hadolint: str) -> None:
    done = subprocess.run([hadolint, str(DOCKERFILE)], check=False, capture_output=True, text=True)
    expect(done.returncode == 0, f"hadolint: {done.stdout}{done.stderr}")


def dockerfile_builds_the_workspace() -> None:
    """The build stage names packages and binaries the workspace has, with a toolchain no older
    than the workspace's rust-version (the image itself cannot be built here)."""
    text = DOCKERFILE.read_text()
    toolchain = re.search(r"^ARG RUST_VERSION=(\d+)\.(\d+)", text, re.MULTILINE)
    expect(toolchain is not None, "no ARG RUST_VERSION=MAJOR.MINOR")
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]
    floor = tuple(int(n) for n in workspace["rust-version"].split(".")[:2])
    expect(
        tuple(int(n) for n in toolchain.groups()) >= floor,
        f"RUST_VERSION {'.'.join(toolchain.groups())} is older than rust-version {floor}",
    )
    done = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--locked"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    expect(done.returncode == 0, f"cargo metadata: {done.stderr}")
    packages = json.loads(done.stdout)["packages"]
    binaries = {
        target["name"]
        for package in packages
        for target in package["targets"]
        if "bin" in target["kind"]
    }
    built = set(re.findall(r"-p ([\w-]+)", text))
    expect(built, "the build stage builds no package (-p NAME)")
    unknown = built - {package["name"] for package in packages}
    expect(not unknown, f"the build stage names packages the workspace lacks: {unknown}")
    copied = set(re.findall(r"target/release/([\w-]+)", text))
    expect({"gatewayd", "bch-tui"} <= copied, f"the image gets {copied}, not gatewayd and bch-tui")
    expect(copied <= binaries, f"the image copies binaries no package builds: {copied - binaries}")


def check_config(args, docs: list[dict]) -> None:
    directory = args.work / "check-config"
    directory.mkdir(parents=True, exist_ok=True)
    pod = Pod(docs, directory, args.gatewayd, resolver=53)
    # As the pod's user: the token files must be readable by it.
    try:
        done = subprocess.run(
            pod.as_user([pod.argv[0], "check-config", str(pod.config_file())]),
            check=False,
            capture_output=True,
            text=True,
        )
    finally:
        pod.remove_files()
    expect(
        done.returncode == 0 and not done.stderr.strip(),
        f"exit {done.returncode}: {done.stdout}{done.stderr}",
    )


def docs_examples_keep_liveness_off_the_data_plane() -> None:
    """Every Deployment or StatefulSet in a ```yaml block of docs/*.md probes liveness as the base
    does: a TCP check on the control port. An httpGet on the data port answers 503 at
    server.max_connections, and the kubelet would restart a replica that is merely saturated."""
    seen = 0
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        blocks = re.findall(r"^```yaml\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
        for block in blocks:
            for doc in yaml.safe_load_all(block):
                kind = doc.get("kind") if isinstance(doc, dict) else None
                if kind not in ("Deployment", "StatefulSet"):
                    continue
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    liveness = c.get("livenessProbe")
                    if liveness is None:
                        continue
                    seen += 1
                    control = {
                        p["containerPort"] for p in c.get("ports", []) if p.get("name") == "control"
                    }
                    port = liveness.get("tcpSocket", {}).get("port")
                    expect(
                        port == "control" or port in control,
                        f"{page.name}: {doc['metadata']['name']}/{c['name']}: liveness {liveness} "
                        "is not a TCP check on the control port (the base's)",
                    )
    expect(seen > 0, "no liveness probe in the docs' examples (docs/discovery.md's Deployment)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--gatewayd", required=True)
    parser.add_argument("--drill", required=True)
    parser.add_argument("--dnsmasq", required=True)
    parser.add_argument("--hadolint", required=True)
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--summary", required=True, type=Path)
    args = parser.parse_args()
    rendered: dict[str, list[dict]] = {}
    run_check(
        "render: kubectl kustomize deploy/kubernetes, overlays/picker, and an operator's overlay "
        "with components/podmonitor",
        render_all,
        args,
        rendered,
    )
    versions = " and ".join(KUBERNETES_VERSIONS)
    for name, docs in rendered.items():
        run_check(
            f"validate ({name}): Kubernetes {versions} schemas, strict", validate_rendered, docs
        )
        run_check(
            f"references ({name}): selectors, ports, volumes, user, grace period, discovery name",
            check_references,
            docs,
            "picker" if name == "picker" else "base",
        )
    run_check(
        "docs: the example Deployments' liveness is a TCP check on the control port",
        docs_examples_keep_liveness_off_the_data_plane,
    )
    run_check("hadolint Dockerfile", lint_dockerfile, args.hadolint)
    run_check(
        "Dockerfile: the build stage's packages, binaries and toolchain are the workspace's",
        dockerfile_builds_the_workspace,
    )
    if "base" in rendered:
        run_check(
            "gatewayd check-config on the ConfigMap's gatewayd.toml",
            check_config,
            args,
            rendered["base"],
        )
    for mode in ("base", "picker"):
        if mode not in rendered:
            continue
        directory = args.work / f"pod-{mode}"
        directory.mkdir(parents=True, exist_ok=True)
        run_check(
            f"pod ({mode}): the manifest's command line as runAsUser against workers behind dnsmasq",
            run_pod,
            rendered[mode],
            args,
            directory,
            mode,
        )
    return summary(args.summary)


def summary(path: Path) -> int:
    failed = sum(1 for _, why in RESULTS if why is not None)
    line = f"kubernetes: {len(RESULTS) - failed} passed, {failed} failed"
    path.write_text(line + "\n")
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
