#!/usr/bin/env bash
# Real-worker test: two llama.cpp servers (llama-cpp-python's OpenAI-compatible server, SmolLM2-135M)
# behind gatewayd with the bounded policy, driven by the official `openai` Python client and curl.
#
#   bash tests/real/run.sh
#
# Creates (or reuses) a virtualenv in tests/real/.venv, builds gatewayd, starts the two workers (the
# same GGUF under two model names) and two gatewayds on free loopback ports (tests/real/fleet.sh,
# shared with tests/real/ab.sh): one pool of both, and one pool per model. Runs
# tests/real/checks.py, stops what it started (by pid) and ends with one summary line:
# `real: N passed, M failed`. Logs are kept in tests/real/.work/.
#
# The first run compiles llama.cpp from source (15-25 minutes on 2 cores); pip keeps the built wheel in
# its cache, so later runs (and new virtualenvs) install in seconds.
#
# Environment: BCH_REAL_PROFILE=release builds gatewayd in release mode (default: debug, the build
# `cargo test` already made); BCH_REAL_KEEP_VENV=0 recreates the virtualenv.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# The virtualenv, the model, gatewayd and the two workers: shared with tests/real/ab.sh.
# shellcheck source=tests/real/fleet.sh
. "$HERE/fleet.sh"

fleet_prepare
fleet_build_gatewayd
fleet_pick_ports
fleet_start_workers
fleet_start_gatewayd --policy bounded_consistent_hashing
# The same two workers as two one-worker pools, for the two-model check (docs/models.md).
fleet_start_models_gatewayd --policy bounded_consistent_hashing

# ---------------------------------------------------------------- checks
set +e
timeout 1800 "$PY" "$HERE/checks.py" \
  --gateway "http://127.0.0.1:$GW" --control "http://127.0.0.1:$CTL" \
  --worker "http://127.0.0.1:$W0" --worker "http://127.0.0.1:$W1" \
  --doc "$ROOT/docs/real-workers.md" --summary "$WORK/summary.txt" --model "$MODEL" \
  --models-gateway "http://127.0.0.1:$GW2" --models-control "http://127.0.0.1:$CTL2"
rc=$?
set -e
cleanup
log "done in $(($(date +%s) - START)) s"
if [ -s "$WORK/summary.txt" ]; then
  cat "$WORK/summary.txt"
else
  echo "real: 0 passed, 1 failed"
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
