#!/usr/bin/env bash
# DNS discovery vs the request path: p99 of keyed requests at a fixed rate while a 1,000-record SRV
# name is re-resolved every 100 ms (and, in a third phase, while a second name flips so the ring of
# 1,000 workers is rebuilt on every flip), against phases without refreshes, alternating in one run.
# See docs/benchmarks.md.
#
#   bash bench/discovery.sh            # 3 rounds of 10 s phases (~2 min after the build)
#   bash bench/discovery.sh --quick    # 1 round of 3 s phases (smoke)
#
# Options: --rate N, --phase-secs S, --rounds N, --out FILE, --no-pin, --profile P (cargo profile;
# release by default, dev in --quick). Needs dnsmasq (Debian package dnsmasq-base; installed if
# missing and running as root).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=discovery
# shellcheck source=bench/lib.sh
source bench/lib.sh

RATE=400 PHASE=10 ROUNDS=3 PIN=1 QUICK=0 OUT="" PROFILE="" RECORDS=1000
PORT_BASE=${BENCH_PORT_BASE:-31000}
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --rate) RATE=$2; shift ;;
    --phase-secs) PHASE=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-pin) PIN=0 ;;
    --profile) PROFILE=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/discovery.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $QUICK == 1 ]] && { PHASE=3; ROUNDS=1; PROFILE=${PROFILE:-dev}; }
PROFILE=${PROFILE:-release}
OUT=${OUT:-bench/results/discovery$([[ $QUICK == 1 ]] && echo -quick || true).json}

DNSMASQ=$(PATH="$PATH:/usr/sbin:/sbin" command -v dnsmasq || true)
if [[ -z $DNSMASQ ]]; then
  log "installing dnsmasq-base"
  (DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsmasq-base) >/dev/null 2>&1 ||
    die "dnsmasq is missing and could not be installed (apt-get install dnsmasq-base)"
  DNSMASQ=$(PATH="$PATH:/usr/sbin:/sbin" command -v dnsmasq)
fi

PROXY_RUN=(); LOAD_RUN=()
if [[ $PIN == 1 ]] && [[ $(nproc) -ge 2 ]] && command -v taskset >/dev/null 2>&1; then
  PROXY_RUN=(taskset -c 0); LOAD_RUN=(taskset -c "1-$(($(nproc) - 1))")
fi

log "building gatewayd, bch-drill and the discovery_refresh example (profile $PROFILE)"
cargo build --quiet --profile "$PROFILE" -p gatewayd -p bch-drill --bins --example discovery_refresh
TARGET_DIR=$(bench_target_dir)
BIN=$TARGET_DIR/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")

bench_workdir

# RECORDS + 1 workers, then the data, control and DNS ports: move up by 2,000 until all are free.
SPAN=$((RECORDS + 4))
if [[ -z ${BENCH_PORT_BASE:-} ]]; then
  for _ in $(seq 1 10); do
    busy=0
    for p in $(seq "$PORT_BASE" $((PORT_BASE + SPAN))); do port_free "$p" || { busy=1; break; }; done
    [[ $busy == 0 ]] && break
    PORT_BASE=$((PORT_BASE + 2000))
  done
fi
FLAP_PORT=$((PORT_BASE + RECORDS)) DATA=$((PORT_BASE + RECORDS + 1))
CONTROL=$((PORT_BASE + RECORDS + 2)) DNS=$((PORT_BASE + RECORDS + 3))

"${LOAD_RUN[@]}" "$BIN/bch-drill" workers --count $((RECORDS + 1)) --base-port "$PORT_BASE" \
  --time-scale 0 --cache-blocks 0 >"$WORK/workers.log" 2>&1 &
PIDS+=($!)

# One SRV target for every record: dnsmasq 2.90 mis-compresses names past 16 KiB of answer, and a
# thousand distinct targets with their addresses would be 48 KB (docs/discovery.md, "Limits").
{
  printf 'port=%s\nlisten-address=127.0.0.1\nbind-interfaces\nno-resolv\nno-hosts\n' "$DNS"
  printf 'addn-hosts=%s\nlocal-ttl=3600\nlocal=/test/\npid-file=\nlog-facility=%s\n' "$WORK/hosts" "$WORK/dnsmasq.log"
  [[ $(id -u) == 0 ]] && printf 'user=root\n'
  printf 'host-record=w.bench.test,127.0.0.1\n'
  for i in $(seq 0 $((RECORDS - 1))); do
    printf 'srv-host=_llm._tcp.bench.test,w.bench.test,%s,0,10\n' $((PORT_BASE + i))
  done
} >"$WORK/dnsmasq.conf"
: >"$WORK/hosts"
"${LOAD_RUN[@]}" "$DNSMASQ" -k --conf-file="$WORK/dnsmasq.conf" &
DNSMASQ_PID=$!; PIDS+=($DNSMASQ_PID)

{
  printf '[server]\nlisten = "127.0.0.1:%s"\ncontrol_listen = "127.0.0.1:%s"\n\n' $DATA $CONTROL
  # One probe round every 10 s: 1,000 workers probed every 2 s would be its own load.
  printf '[health]\ninterval_ms = 10000\n\n[log]\nlevel = "warn"\n'
} >"$WORK/base.toml"
cp "$WORK/base.toml" "$WORK/gatewayd.toml"
wait_port "$FLAP_PORT" 60
wait_port "$DNS"
RUST_LOG=warn "${PROXY_RUN[@]}" "$BIN/gatewayd" --config "$WORK/gatewayd.toml" >"$WORK/gatewayd.log" 2>&1 &
GW=$!; PIDS+=($GW)
wait_port $DATA; wait_port $CONTROL

log "$RATE keyed requests/s; $RECORDS SRV records; phases of ${PHASE}s: none, refresh (every 100 ms), refresh+change; $ROUNDS round(s)"
mkdir -p "$(dirname "$OUT")"
"${LOAD_RUN[@]}" "$BIN/examples/discovery_refresh" --gateway "http://127.0.0.1:$DATA" \
  --control "127.0.0.1:$CONTROL" --config "$WORK/gatewayd.toml" --base-config "$WORK/base.toml" \
  --resolver "127.0.0.1:$DNS" --dnsmasq-pid "$DNSMASQ_PID" --hosts "$WORK/hosts" \
  --flap-port "$FLAP_PORT" --rate "$RATE" --phase-secs "$PHASE" --rounds "$ROUNDS" --out "$OUT" >/dev/null
log "results written to $OUT"
