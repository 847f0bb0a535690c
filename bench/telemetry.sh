#!/usr/bin/env bash
# Telemetry cost: gatewayd CPU at a fixed 1,000 requests/s over 256 keys, with 0 and with
# 10 websocket clients reading /ws, alternating phases in one run. See docs/benchmarks.md.
#
#   bash bench/telemetry.sh            # 3 rounds of 10 s phases (~70 s)
#   bash bench/telemetry.sh --quick    # 1 round of 3 s phases (smoke)
#
# Options: --rate N, --keys N, --clients N, --phase-secs S, --rounds N, --out FILE, --no-pin,
# --profile P (cargo profile; release by default, dev in --quick). BENCH_GATEWAYD_BIN measures
# another gatewayd build (a before/after pair in one sitting).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=telemetry
# shellcheck source=bench/lib.sh
source bench/lib.sh

RATE=1000 KEYS=256 CLIENTS=10 PHASE=10 ROUNDS=3 PIN=1 QUICK=0 OUT="" PROFILE=""
PORT_BASE=${BENCH_PORT_BASE:-28600}
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --rate) RATE=$2; shift ;;
    --keys) KEYS=$2; shift ;;
    --clients) CLIENTS=$2; shift ;;
    --phase-secs) PHASE=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-pin) PIN=0 ;;
    --profile) PROFILE=$2; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/telemetry.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $QUICK == 1 ]] && { PHASE=3; ROUNDS=1; PROFILE=${PROFILE:-dev}; }
PROFILE=${PROFILE:-release}
OUT=${OUT:-bench/results/telemetry$([[ $QUICK == 1 ]] && echo -quick || true).json}

PROXY_RUN=(); LOAD_RUN=()
if [[ $PIN == 1 ]] && [[ $(nproc) -ge 2 ]] && command -v taskset >/dev/null 2>&1; then
  PROXY_RUN=(taskset -c 0); LOAD_RUN=(taskset -c "1-$(($(nproc) - 1))")
fi

log "building gatewayd, bch-drill and the telemetry_cost example (profile $PROFILE)"
cargo build --quiet --profile "$PROFILE" -p gatewayd -p bch-drill --bins --example telemetry_cost
TARGET_DIR=$(bench_target_dir)
BIN=$TARGET_DIR/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")

bench_workdir

if [[ -z ${BENCH_PORT_BASE:-} ]]; then
  # Another run holds the default range: move up by 100 until 12 ports are free.
  for _ in $(seq 1 20); do
    busy=0
    for p in $(seq "$PORT_BASE" $((PORT_BASE + 11))); do port_free "$p" || { busy=1; break; }; done
    [[ $busy == 0 ]] && break
    PORT_BASE=$((PORT_BASE + 100))
  done
fi
WORKERS=4
"${LOAD_RUN[@]}" "$BIN/bch-drill" workers --count $WORKERS --base-port "$PORT_BASE" --time-scale 0 \
  --cache-blocks 0 >"$WORK/workers.log" 2>&1 &
PIDS+=($!)
DATA=$((PORT_BASE + 10)) CONTROL=$((PORT_BASE + 11))
{
  printf '[server]\nlisten = "127.0.0.1:%s"\ncontrol_listen = "127.0.0.1:%s"\n\n' $DATA $CONTROL
  printf '[policy]\nkind = "bounded_consistent_hashing"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\n'
  printf '[telemetry]\nmax_keys = %s\n\n[log]\nlevel = "warn"\n' "$KEYS"
  for i in $(seq 0 $((WORKERS - 1))); do
    printf '\n[[workers]]\nname = "sim-%s"\nurl = "http://127.0.0.1:%s"\n' "$i" $((PORT_BASE + i))
  done
} >"$WORK/gatewayd.toml"
wait_port $((PORT_BASE + WORKERS - 1))
RUST_LOG=warn "${PROXY_RUN[@]}" "${BENCH_GATEWAYD_BIN:-$BIN/gatewayd}" --config "$WORK/gatewayd.toml" >"$WORK/gatewayd.log" 2>&1 &
GW=$!; PIDS+=($GW)
wait_port $DATA; wait_port $CONTROL
# Workers take traffic once their first probe passed.
python3 - "$DATA" <<'PY'
import sys, time, urllib.request
deadline = time.time() + 30
while time.time() < deadline:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readiness", timeout=1)
        sys.exit(0)
    except Exception:  # noqa: BLE001 - 503 or no answer: not ready yet
        time.sleep(0.1)
sys.exit("gatewayd not ready after 30 s")
PY

log "$RATE requests/s over $KEYS keys; phases of ${PHASE}s without and with $CLIENTS websocket clients, $ROUNDS round(s)"
mkdir -p "$(dirname "$OUT")"
"${LOAD_RUN[@]}" "$BIN/examples/telemetry_cost" --gateway "http://127.0.0.1:$DATA" --control "127.0.0.1:$CONTROL" \
  --pid "$GW" --rate "$RATE" --keys "$KEYS" --clients "$CLIENTS" --phase-secs "$PHASE" --rounds "$ROUNDS" \
  --out "$OUT" >/dev/null
log "results written to $OUT"
