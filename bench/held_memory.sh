#!/usr/bin/env bash
# Where a held SSE stream's memory goes in gatewayd: workload (c) of bench/proxy.sh (streams held
# open through gatewayd to slow simulated workers), once without a profiler for the RSS per
# stream and once under heaptrack, whose heap at the peak is attributed to its owners
# (bench/held_memory.py).
#
#   bash bench/held_memory.sh               # 1,000 held streams, release build
#   bash bench/held_memory.sh --streams N   # other counts (mind the open-file limit: 2 per stream)
#   bash bench/held_memory.sh --tls         # the client side over TLS (the workers stay plain HTTP)
#   BENCH_GATEWAYD_BIN=path bash bench/held_memory.sh   # another gatewayd build (before/after)
#
# --tls serves the data plane with [server.tls] (a CA and an ECDSA P-256 certificate for IP
# 127.0.0.1 made with the openssl CLI, as bench/proxy_tls.sh does) and the client verifies it
# against that CA. --no-build uses the release binaries already built (cargo's target directory,
# or CARGO_TARGET_DIR). --keep DIR copies the runs' JSON and heaptrack's folded peak stacks there.
# Needs heaptrack (apt-get install heaptrack), python3 and, with --tls, openssl. Everything
# listens on 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=held-memory
# shellcheck source=bench/lib.sh
source bench/lib.sh

STREAMS=1000
TLS=0
BUILD=1
KEEP=""
PORT_BASE=${BENCH_PORT_BASE:-29690}
while [[ $# -gt 0 ]]; do
  case $1 in
    --streams) STREAMS=$2; shift ;;
    --tls) TLS=1 ;;
    --no-build) BUILD=0 ;;
    --keep) KEEP=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
command -v heaptrack >/dev/null || die "heaptrack is missing (apt-get install heaptrack)"
[[ $TLS == 0 ]] || command -v openssl >/dev/null || die "openssl is missing (--tls makes its certificates with it)"
bench_workdir

if [[ $BUILD == 1 ]]; then
  log "building gatewayd and bch-drill (release)"
  cargo build --release --locked -p gatewayd -p bch-drill >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; die "build failed"; }
fi
TARGET=$(bench_target_dir)/release
GATEWAYD=${BENCH_GATEWAYD_BIN:-$TARGET/gatewayd}
python3 bench/bodies.py "$WORK" >/dev/null
CLIENT_TLS=()
if [[ $TLS == 1 ]]; then
  bench_certificates
  CLIENT_TLS=(--ca-file "$WORK/ca.crt")
fi

LISTEN=$PORT_BASE CONTROL=$((PORT_BASE + 1)) WORKER_BASE=$((PORT_BASE + 10))
"$TARGET/bch-drill" workers --count 4 --base-port "$WORKER_BASE" --time-scale 1 --cache-blocks 0 \
  --max-batch 100000 --chunk-tokens 100000 --prefill-tokens-per-s inf --no-prefix-wait --decode-base-ms 1000 \
  --decode-per-running-ms 0 >"$WORK/workers.log" 2>&1 &
PIDS+=($!)
wait_port $((WORKER_BASE + 3))
SERVER_LINES='max_connections = 20000\n'
[[ $TLS == 0 ]] || SERVER_LINES+=$(printf '\n[server.tls]\ncert_file = "%s"\nkey_file = "%s"\n' "$WORK/proxy.crt" "$WORK/proxy.key")
bench_gatewayd_toml "$LISTEN" "$CONTROL" "$WORKER_BASE" "$SERVER_LINES" >"$WORK/gatewayd.toml"

# One run: gatewayd (under $1... when given), held streams, gatewayd stopped with SIGINT so
# heaptrack writes its data. Prints hold_streams.py's JSON.
run_once() {
  "$@" "$GATEWAYD" --config "$WORK/gatewayd.toml" >>"$WORK/gatewayd.log" 2>&1 &
  local wrapper=$!
  wait_port "$LISTEN" 30
  local pid
  pid=$(pgrep -n -f "$GATEWAYD --config $WORK/gatewayd.toml")
  python3 bench/hold_streams.py --port "$LISTEN" --body "$WORK/body_c.json" --streams "$STREAMS" \
    --keys 1000 --hold 3 --pid "$pid" "${CLIENT_TLS[@]}"
  kill -INT "$pid"
  wait "$wrapper" 2>/dev/null || true
}

log "holding $STREAMS streams through gatewayd$([[ $TLS == 1 ]] && echo ', over TLS')"
run_once >"$WORK/rss.json"
RSS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rss_per_stream_kib"])' "$WORK/rss.json")
log "RSS per held stream: $RSS KiB; again under heaptrack"
run_once heaptrack -o "$WORK/heap" >"$WORK/heaptrack.json" 2>"$WORK/heaptrack.err"
heaptrack_print "$WORK"/heap.*zst --print-peaks=0 --print-allocators=0 --print-temporary=0 \
  --print-leaks=0 -F "$WORK/peak.folded" --flamegraph-cost-type peak >/dev/null 2>&1
python3 bench/held_memory.py "$WORK/peak.folded" --streams "$STREAMS" --rss-per-stream-kib "$RSS"
if [[ -n $KEEP ]]; then
  mkdir -p "$KEEP"
  cp "$WORK/rss.json" "$WORK/heaptrack.json" "$WORK/peak.folded" "$KEEP/"
  log "runs' JSON and folded peak stacks copied to $KEEP"
fi
