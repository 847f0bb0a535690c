"""The manifests as `kubectl kustomize` renders them: rendering (the base, overlays/picker, and the
overlay docs/kubernetes.md has an operator write), validation against the Kubernetes JSON schemas,
and the references between the rendered resources, the Dockerfile and gatewayd's configuration.
checks.py's "render", "validate" and "references" checks run these; pod.py reads the rendered
Deployment with find, generated and container. checks.py's docstring says what each check proves.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import yaml

from checking import CheckFailed, expect

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
