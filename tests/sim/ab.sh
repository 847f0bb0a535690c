#!/usr/bin/env bash
# Policy A/Bs on simulated workers behind a real gatewayd, each one command (docs/drill.md):
#
#   bash tests/sim/ab.sh original   # the original bounded-policy A/B: 2 workers, strict vs gap=1,2,4
#   bash tests/sim/ab.sh hot        # ring vs hash_seeded under a hot-key storm on 8 workers
#   bash tests/sim/ab.sh search     # the trade-off search: gap, skew and spill order on 2 workers
#   bash tests/sim/ab.sh search-loaded   # the same with two groups in flight
#
# Starts `bch-drill workers` and gatewayd (release builds) on free loopback ports, runs
# `bch-drill ab`, writes drill-out/sim-<mode>.{json,svg,txt} and stops what it started (by pid).
# Extra arguments go to `bch-drill ab` (e.g. --reps 3, --seed 7); BCH_SIM_TIME_SCALE (default 0.5)
# sets the workers' time scale.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODE=${1:?usage: tests/sim/ab.sh original|hot|search|search-loaded [bch-drill ab options]}
shift
OUT="$ROOT/drill-out"
mkdir -p "$OUT"
SCALE=${BCH_SIM_TIME_SCALE:-0.5}

case "$MODE" in
original)
  WORKERS=2
  AB=(--cells strict,gap=1,gap=2,gap=4 --reps 5 --groups 60 --siblings 8 --concurrency 1
    --prefix-scope group --prefix-tokens 1024 --suffix-tokens 160 --max-tokens 32)
  ;;
hot)
  WORKERS=8
  AB=(--cells strict,gap=2,gap=2:order=hash_seeded,gap=2:vnodes=4,gap=2:vnodes=4:order=hash_seeded
    --reps 5 --groups 120 --siblings 8 --concurrency 6 --keys 32 --hot-keys 2 --hot-share 0.8
    --prefix-scope key --prefix-tokens 1024 --suffix-tokens 32 --max-tokens 32)
  ;;
search | search-loaded)
  # The trade-off search: the original setting (gap=2) against every lever on the same workload;
  # `search-loaded` keeps two groups in flight, so the bound also sees other groups' load.
  WORKERS=2
  CONCURRENCY=1
  [ "$MODE" = search-loaded ] && CONCURRENCY=2
  AB=(--cells strict,gap=2,gap=0:skew=1,skew=1.25,gap=4,gap=6,skew=2,gap=2:order=hash_seeded
    --reps 5 --groups 40 --siblings 8 --concurrency "$CONCURRENCY"
    --prefix-scope group --prefix-tokens 1024 --suffix-tokens 160 --max-tokens 32)
  ;;
*)
  echo "unknown mode $MODE: expected original, hot, search or search-loaded" >&2
  exit 2
  ;;
esac

BENCH_NAME=sim
# log, PIDS and their cleanup on exit, wait_probed.
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
trap bench_cleanup EXIT
(cd "$ROOT" && cargo build -q --locked --release -p gatewayd -p bch-drill)
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"

# Free ports: WORKERS consecutive ones are not guaranteed, so the workers take port 0 and print
# where they listen.
"$BIN/bch-drill" workers --count "$WORKERS" --base-port 0 --time-scale "$SCALE" >"$OUT/sim-$MODE.workers" 2>/dev/null &
PIDS+=($!)
for _ in $(seq 1 100); do
  [ "$(wc -l <"$OUT/sim-$MODE.workers")" -ge "$WORKERS" ] && break
  sleep 0.1
done
WORKER_ARGS=()
while read -r _name url; do WORKER_ARGS+=(--worker "$url"); done <"$OUT/sim-$MODE.workers"
[ "${#WORKER_ARGS[@]}" = $((2 * WORKERS)) ] || { echo "workers did not start" >&2; exit 1; }

read -r GW CTL <<<"$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')"
"$BIN/gatewayd" --listen "127.0.0.1:$GW" --control-listen "127.0.0.1:$CTL" "${WORKER_ARGS[@]}" \
  >"$OUT/sim-$MODE.gatewayd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
  curl -fsS -o /dev/null "http://127.0.0.1:$GW/readiness" 2>/dev/null && break
  sleep 0.1
done
# Workers take traffic once their first probe passed; readiness needs one, the A/B needs all.
wait_probed "http://127.0.0.1:$CTL" "$WORKERS"

log "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $WORKERS workers at time scale $SCALE"
"$BIN/bch-drill" ab --gateway "http://127.0.0.1:$GW" --control "http://127.0.0.1:$CTL" "${AB[@]}" "$@" \
  --out "$OUT/sim-$MODE.json" --plot "$OUT/sim-$MODE.svg" | tee "$OUT/sim-$MODE.txt"
log "machine after: load average $(cut -d' ' -f1-3 /proc/loadavg)"
