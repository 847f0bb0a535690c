#!/usr/bin/env bash
# Instructions per request of gatewayd, counted by valgrind's callgrind: unlike CPU time, the count
# does not depend on what else the machine is doing, so two builds can be compared on a busy box.
# See docs/benchmarks.md ("Before and after").
#
#   bash bench/instructions.sh [--workloads a,b] [--seconds 10] [--connections 8]
#
# Workloads as in bench/proxy.sh: (a) keyed POST with a 1 KiB JSON answer, (b) keyed SSE of 64
# events. gatewayd (release, bounded policy, gap 2, skew 1.5, log level warn) runs under callgrind in
# front of four instant bch-drill workers; wrk drives it; the instructions executed while wrk ran
# (counters zeroed once gatewayd listens, dumped before it stops) are divided by the requests wrk
# completed. BENCH_GATEWAYD_BIN measures another build. Needs valgrind and wrk (installed with apt-get when missing). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=instructions
# shellcheck source=bench/lib.sh
source bench/lib.sh
ROOT=$PWD
WORKLOADS=a,b
SECONDS_PER=10
CONNECTIONS=8
PORT_BASE=${BENCH_PORT_BASE:-28600}
while [[ $# -gt 0 ]]; do
  case $1 in
    --workloads) WORKLOADS=$2; shift ;;
    --seconds) SECONDS_PER=$2; shift ;;
    --connections) CONNECTIONS=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/instructions.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

missing=()
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing ${missing[*]}"
  SUDO=$([[ $(id -u) == 0 ]] && echo "" || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

log "building gatewayd and bch-drill (release)"
cargo build --quiet --release -p gatewayd -p bch-drill
TARGET_DIR=$(bench_target_dir)
GATEWAYD=${BENCH_GATEWAYD_BIN:-$TARGET_DIR/release/gatewayd}
DRILL=$TARGET_DIR/release/bch-drill

bench_workdir
PIN=()
[[ $(nproc) -ge 2 ]] && command -v taskset >/dev/null 2>&1 && PIN=(taskset -c 0)
LOAD=()
[[ ${#PIN[@]} -gt 0 ]] && LOAD=(taskset -c 1-$(($(nproc) - 1)))

python3 "$ROOT/bench/bodies.py" "$WORK"
WORKER_BASE=$PORT_BASE GW=$((PORT_BASE + 10)) GW_CTL=$((PORT_BASE + 11))
"${LOAD[@]}" "$DRILL" workers --count 4 --base-port "$WORKER_BASE" --time-scale 0 --cache-blocks 0 \
  --max-batch 100000 >"$WORK/workers.log" 2>&1 &
PIDS+=($!)
wait_port $((WORKER_BASE + 3))
{
  printf '[server]\nlisten = "127.0.0.1:%s"\ncontrol_listen = "127.0.0.1:%s"\n\n' "$GW" "$GW_CTL"
  printf '[policy]\nkind = "bounded_consistent_hashing"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\n[log]\nlevel = "warn"\n'
  for i in 0 1 2 3; do printf '\n[[workers]]\nname = "sim-%s"\nurl = "http://127.0.0.1:%s"\n' "$i" $((WORKER_BASE + i)); done
} >"$WORK/gatewayd.toml"

printf '%-10s %10s %16s %14s\n' workload requests instructions "per request"
for workload in ${WORKLOADS//,/ }; do
  RUST_LOG=warn "${PIN[@]}" valgrind --tool=callgrind --callgrind-out-file="$WORK/cg-$workload.out" \
    "$GATEWAYD" --config "$WORK/gatewayd.toml" >"$WORK/gatewayd-$workload.log" 2>&1 &
  pid=$!
  wait_port "$GW" 60
  # Workers wait for their first probe before they take traffic: start once one has passed, so
  # no early 503 counts as a (cheap) request.
  python3 - "$GW" <<'PY' || die "gatewayd not ready"
import sys, time, urllib.request
deadline = time.time() + 60
while time.time() < deadline:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readiness", timeout=2)
        sys.exit(0)
    except Exception:  # noqa: BLE001 - 503 or no answer: not ready yet
        time.sleep(0.1)
sys.exit("gatewayd not ready after 60 s")
PY
  # Count the traffic only: start-up is zeroed away, and the counts are dumped before shutdown, so
  # a slow run (fewer requests) does not spread start-up over fewer requests.
  callgrind_control --zero "$pid" >/dev/null 2>&1
  BENCH_BODY="$WORK/body_$workload.json" BENCH_KEYS=1000 BENCH_OUT="$WORK/wrk-$workload.json" \
    "${LOAD[@]}" wrk -t1 -c"$CONNECTIONS" -d"${SECONDS_PER}s" --timeout 30s -s "$ROOT/bench/keyed.lua" \
    "http://127.0.0.1:$GW" >/dev/null || die "wrk failed"
  callgrind_control --dump=traffic "$pid" >/dev/null 2>&1
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  requests=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["requests"])' "$WORK/wrk-$workload.json")
  dump=$(grep -l '^desc: Trigger: dump traffic' "$WORK"/cg-"$workload".out* | head -n1 || true)
  [[ -n $dump ]] || die "callgrind wrote no traffic dump for $workload"
  total=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
  [[ -n $total && $requests -gt 0 ]] || die "no callgrind total or no requests for $workload"
  printf '%-10s %10d %16d %14d\n' "$workload" "$requests" "$total" $((total / requests))
done
