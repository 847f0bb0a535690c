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

The checks live beside this entry point, one job a module: manifests.py renders, validates and
follows the references; pod.py runs the pod; checking.py keeps the results. This file has main and
the checks that read the Dockerfile, the docs and the ConfigMap.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from checking import expect, run_check, summary
from manifests import (
    DEPLOY,
    DOCKERFILE,
    KUBERNETES_VERSIONS,
    ROOT,
    check_references,
    container,
    find,
    generated,
    operator_overlay,
    render,
    validate,
)
from pod import Pod, run_pod


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


if __name__ == "__main__":
    sys.exit(main())
