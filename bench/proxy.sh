#!/usr/bin/env bash
# Proxy benchmark: direct vs gatewayd vs HAProxy (bounded-load consistent hashing) in front of the
# same simulated upstream, interleaved, medians over repetitions. See docs/benchmarks.md.
#
#   bash bench/proxy.sh                 # full run (~10 min): 3 reps, 10 s per trial, 5,000 held streams
#   bash bench/proxy.sh --quick         # CI smoke (< 1 min after the build): 1 rep, short trials
#
# Options: --reps N, --duration S, --warmup S, --streams N, --hold S, --connections N, --keys N,
# --workers N, --workloads a,b,c, --targets direct,gatewayd,haproxy, --no-pin, --profile P
# (cargo profile of gatewayd/bch-drill; release by default, dev in --quick), --out FILE (JSON),
# --no-install (fail instead of apt-get installing haproxy/wrk/python3).
# Everything listens on 127.0.0.1 only; every process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=bench
# shellcheck source=bench/lib.sh
source bench/lib.sh
ROOT=$PWD

QUICK=0
REPS=3
DURATION=10
WARMUP=2
STREAMS=5000
HOLD=10
CONNECTIONS=64
KEYS=1000
WORKERS=4
WORKLOADS=a,b,c
TARGETS=direct,gatewayd,haproxy
PIN=1
PROFILE=""
OUT=""
INSTALL=1
PORT_BASE=${BENCH_PORT_BASE:-28400}

while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --reps) REPS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --streams) STREAMS=$2; shift ;;
    --hold) HOLD=$2; shift ;;
    --connections) CONNECTIONS=$2; shift ;;
    --keys) KEYS=$2; shift ;;
    --workers) WORKERS=$2; shift ;;
    --workloads) WORKLOADS=$2; shift ;;
    --targets) TARGETS=$2; shift ;;
    --no-pin) PIN=0 ;;
    --profile) PROFILE=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-install) INSTALL=0 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/proxy.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $QUICK == 1 ]]; then
  REPS=1 DURATION=2 WARMUP=1 STREAMS=500 HOLD=2
  PROFILE=${PROFILE:-dev}
fi
PROFILE=${PROFILE:-release}
OUT=${OUT:-bench/results/proxy$([[ $QUICK == 1 ]] && echo -quick || true).json}


# ---------------------------------------------------------------------------------------------
# Tools: haproxy, wrk, python3 (Debian packages), taskset (util-linux).
missing=()
command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [[ ${#missing[@]} -gt 0 ]]; then
  [[ $INSTALL == 1 ]] || die "missing ${missing[*]} (and --no-install given)"
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]}; install them (no apt-get here)"
  SUDO=""; [[ $(id -u) == 0 ]] || SUDO="sudo"
  log "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
if [[ $PIN == 1 ]] && { [[ $(nproc) -lt 2 ]] || ! command -v taskset >/dev/null 2>&1; }; then
  log "not pinning: needs taskset and 2+ cores"
  PIN=0
fi
if [[ $PIN == 1 ]]; then
  # The proxy under test gets CPU 0; load generator and upstream share the others. HAProxy and
  # tokio both size their thread pools from the affinity mask, so each proxy runs one thread.
  PROXY_CPUS=0
  LOAD_CPUS="1-$(($(nproc) - 1))"
  PROXY_RUN=(taskset -c "$PROXY_CPUS")
  LOAD_RUN=(taskset -c "$LOAD_CPUS")
  WRK_THREADS=$(($(nproc) - 1))
else
  PROXY_RUN=()
  LOAD_RUN=()
  WRK_THREADS=2
fi

# Held streams need a file descriptor each on both sides of the proxy.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
if [[ $NOFILE != unlimited ]] && (( NOFILE < 2 * STREAMS + 1000 )); then
  STREAMS=$(( (NOFILE - 1000) / 2 ))
  log "open-file limit $NOFILE: holding only $STREAMS streams"
fi

# ---------------------------------------------------------------------------------------------
log "building gatewayd and bch-drill (profile $PROFILE)"
cargo build --quiet --profile "$PROFILE" -p gatewayd -p bch-drill
TARGET_DIR=$(bench_target_dir)
BIN_DIR=$TARGET_DIR/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
# BENCH_GATEWAYD_BIN runs another gatewayd build (e.g. an older commit's, for before/after numbers).
GATEWAYD=${BENCH_GATEWAYD_BIN:-$BIN_DIR/gatewayd}
DRILL=$BIN_DIR/bch-drill

bench_workdir

# Ports: fast workers BASE.., slow workers BASE+20.., gatewayd BASE+40/41 and BASE+42/43, HAProxy BASE+44/45.
# Without BENCH_PORT_BASE, a busy range (another run of this script) moves the base up by 100.
range_free() {
  local p
  for p in $(seq "$1" $(($1 + 45))); do port_free "$p" || return 1; done
}
if [[ -z ${BENCH_PORT_BASE:-} ]]; then
  for _ in $(seq 1 20); do range_free "$PORT_BASE" && break; PORT_BASE=$((PORT_BASE + 100)); done
fi
FAST_BASE=$PORT_BASE
SLOW_BASE=$((PORT_BASE + 20))
GW_FAST=$((PORT_BASE + 40)); GW_FAST_CTL=$((PORT_BASE + 41))
GW_SLOW=$((PORT_BASE + 42)); GW_SLOW_CTL=$((PORT_BASE + 43))
HA_FAST=$((PORT_BASE + 44)); HA_SLOW=$((PORT_BASE + 45))
for p in $(seq "$FAST_BASE" $((FAST_BASE + WORKERS - 1))) $(seq "$SLOW_BASE" $((SLOW_BASE + WORKERS - 1))) \
  $GW_FAST $GW_FAST_CTL $GW_SLOW $GW_SLOW_CTL $HA_FAST $HA_SLOW; do
  port_free "$p" || die "port $p is in use; set BENCH_PORT_BASE to a free range"
done

# Request bodies: ~1 KiB of JSON each (bench/bodies.py).
python3 "$ROOT/bench/bodies.py" "$WORK"

# Upstreams: one process of instant workers (a, b) and one of slow workers for the held streams (c):
# a chunk per second per stream, no prefill, unbounded batch.
log "starting $WORKERS instant workers on $FAST_BASE.. and $WORKERS slow workers on $SLOW_BASE.."
"${LOAD_RUN[@]}" "$DRILL" workers --count "$WORKERS" --base-port "$FAST_BASE" --time-scale 0 \
  --cache-blocks 0 --max-batch 100000 >"$WORK/fast-workers.log" 2>&1 &
FAST_PID=$!; PIDS+=("$FAST_PID")
"${LOAD_RUN[@]}" "$DRILL" workers --count "$WORKERS" --base-port "$SLOW_BASE" --time-scale 1 \
  --cache-blocks 0 --max-batch 100000 --prefill-base-ms 0 --prefill-us-per-token 0 \
  --decode-base-ms 1000 --decode-per-running-ms 0 >"$WORK/slow-workers.log" 2>&1 &
SLOW_PID=$!; PIDS+=("$SLOW_PID")
wait_port $((FAST_BASE + WORKERS - 1)); wait_port $((SLOW_BASE + WORKERS - 1))

# Configurations: the same workers, header, policy and thresholds for both proxies.
write_gatewayd_config() { # file listen control worker_base
  {
    printf '[server]\nlisten = "127.0.0.1:%s"\ncontrol_listen = "127.0.0.1:%s"\nmax_connections = 20000\n\n' "$2" "$3"
    printf '[policy]\nkind = "bounded_consistent_hashing"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\n'
    printf '[log]\nlevel = "warn"\n'
    local i
    for i in $(seq 0 $((WORKERS - 1))); do
      printf '\n[[workers]]\nname = "sim-%s"\nurl = "http://127.0.0.1:%s"\n' "$i" $(($4 + i))
    done
  } >"$1"
}
write_haproxy_config() { # file listen worker_base
  {
    cat <<CFG
global
    maxconn $HA_MAXCONN
    # no log lines: gatewayd runs with access logs off (level warn) too

defaults
    mode http
    timeout connect 2s
    timeout client 5m
    timeout server 5m
    timeout tunnel 1h
    timeout http-keep-alive 90s

frontend bench
    bind 127.0.0.1:$2
    default_backend workers

backend workers
    balance hdr(X-SMG-Routing-Key)
    hash-type consistent
    hash-balance-factor 150
CFG
    local i
    for i in $(seq 0 $((WORKERS - 1))); do
      printf '    server sim-%s 127.0.0.1:%s check inter 2s maxconn 10000\n' "$i" $(($3 + i))
    done
  } >"$1"
}
# HAProxy wants two descriptors per connection plus a few: stay under the open-file limit.
HA_MAXCONN=12000
[[ $NOFILE != unlimited ]] && (( (NOFILE - 200) / 2 < HA_MAXCONN )) && HA_MAXCONN=$(( (NOFILE - 200) / 2 ))
write_gatewayd_config "$WORK/gw-fast.toml" $GW_FAST $GW_FAST_CTL $FAST_BASE
write_gatewayd_config "$WORK/gw-slow.toml" $GW_SLOW $GW_SLOW_CTL $SLOW_BASE
write_haproxy_config "$WORK/ha-fast.cfg" $HA_FAST $FAST_BASE
write_haproxy_config "$WORK/ha-slow.cfg" $HA_SLOW $SLOW_BASE
"$HAPROXY" -c -q -f "$WORK/ha-fast.cfg" || die "HAProxy rejected its configuration"

# Sanity: the upstream answers what the workloads claim.
python3 - "$WORK" "$FAST_BASE" <<'PY'
import json, sys, urllib.request
work, port = sys.argv[1], sys.argv[2]
def post(name):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
        data=open(f"{work}/body_{name}.json", "rb").read(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=10).read()
a, b = post("a"), post("b")
events = b.count(b"data: ")
json.dump({"request_bytes": len(open(f"{work}/body_a.json", "rb").read()), "response_bytes_a": len(a),
           "sse_events_b": events, "sse_bytes_b": len(b)}, open(f"{work}/shape.json", "w"))
print(f"[bench] request body {len(open(f'{work}/body_a.json','rb').read())} B; (a) response {len(a)} B; (b) {events} SSE events, {len(b)} B", file=sys.stderr)
PY

# ---------------------------------------------------------------------------------------------
CURRENT_PID=""
start_target() { # target workload -> sets PORT, CURRENT_PID
  local target=$1 workload=$2 speed=fast
  [[ $workload == c ]] && speed=slow
  CURRENT_PID=""
  case $target in
    direct)
      if [[ $speed == fast ]]; then PORT=$FAST_BASE; else PORT=$SLOW_BASE; fi ;;
    gatewayd)
      if [[ $speed == fast ]]; then PORT=$GW_FAST; else PORT=$GW_SLOW; fi
      RUST_LOG=warn "${PROXY_RUN[@]}" "$GATEWAYD" --config "$WORK/gw-$speed.toml" >>"$WORK/gatewayd.log" 2>&1 &
      CURRENT_PID=$! ;;
    haproxy)
      if [[ $speed == fast ]]; then PORT=$HA_FAST; else PORT=$HA_SLOW; fi
      "${PROXY_RUN[@]}" "$HAPROXY" -db -f "$WORK/ha-$speed.cfg" >>"$WORK/haproxy.log" 2>&1 &
      CURRENT_PID=$! ;;
  esac
  [[ -n $CURRENT_PID ]] && PIDS+=("$CURRENT_PID")
  wait_port "$PORT"
}
stop_target() {
  [[ -n $CURRENT_PID ]] || return 0
  kill "$CURRENT_PID" 2>/dev/null || true
  wait "$CURRENT_PID" 2>/dev/null || true
  CURRENT_PID=""
}
cpu_seconds() { # pid -> utime+stime in seconds
  awk -v t="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / t }' "/proc/$1/stat"
}
peak_rss_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }

run_wrk() { # workload port seconds outfile
  local path=/v1/chat/completions
  BENCH_BODY="$WORK/body_$1.json" BENCH_KEYS=$KEYS BENCH_PATH=$path BENCH_OUT=$4 \
    "${LOAD_RUN[@]}" wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"${3}s" --timeout 10s \
    -s "$ROOT/bench/keyed.lua" "http://127.0.0.1:$2" >"$4.txt" 2>&1 || die "wrk failed: $(cat "$4.txt")"
}

trial() { # workload target rep
  local workload=$1 target=$2 rep=$3 out="$WORK/trial-$1-$2-$3"
  start_target "$target" "$workload"
  local pid=${CURRENT_PID:-}
  if [[ $workload == c ]]; then
    "${LOAD_RUN[@]}" python3 "$ROOT/bench/hold_streams.py" --port "$PORT" --body "$WORK/body_c.json" \
      --streams "$STREAMS" --keys "$KEYS" --hold "$HOLD" ${pid:+--pid "$pid"} >"$out.json" \
      || die "hold_streams.py failed against $target"
    python3 - "$out.json" "$workload" "$target" "$rep" >>"$WORK/trials.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
opened = r["opened"]
row = {"workload": sys.argv[2], "target": sys.argv[3], "rep": int(sys.argv[4]),
       "rps": opened / r["open_seconds"] if r["open_seconds"] else 0.0,
       "p50_ms": (r["ttfc_us"]["p50"] or 0) / 1000, "p99_ms": (r["ttfc_us"]["p99"] or 0) / 1000,
       "requests": opened, "failed": r["failed"] + r["ended_early"], "errors": r["errors"]}
if "cpu_s_total" in r:
    row.update({"cpu_s": r["cpu_s_total"], "cpu_per_1k": r["cpu_s_total"] / max(1, opened) * 1000,
                "peak_rss_kib": r["peak_rss_kib"], "rss_per_stream_kib": r["rss_per_stream_kib"],
                "rss_before_kib": r["rss_before_kib"], "rss_held_kib": r["rss_held_kib"]})
print(json.dumps(row))
PY
  else
    run_wrk "$workload" "$PORT" "$WARMUP" "$out.warmup"
    local cpu0="" cpu1=""
    [[ -n $pid ]] && cpu0=$(cpu_seconds "$pid")
    run_wrk "$workload" "$PORT" "$DURATION" "$out.json"
    if [[ -n $pid ]]; then cpu1=$(cpu_seconds "$pid"); rss=$(peak_rss_kib "$pid"); fi
    python3 - "$out.json" "$workload" "$target" "$rep" "$cpu0" "$cpu1" "${rss:-}" >>"$WORK/trials.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
_, _, workload, target, rep, cpu0, cpu1, rss = sys.argv
e = r["errors"]
row = {"workload": workload, "target": target, "rep": int(rep),
       "rps": r["requests"] / (r["duration_us"] / 1e6), "p50_ms": r["latency_us"]["p50"] / 1000,
       "p99_ms": r["latency_us"]["p99"] / 1000, "requests": r["requests"],
       "failed": e["connect"] + e["read"] + e["write"] + e["status"] + e["timeout"], "errors": e}
if cpu0:
    cpu = float(cpu1) - float(cpu0)
    row.update({"cpu_s": cpu, "cpu_per_1k": cpu / max(1, r["requests"]) * 1000, "peak_rss_kib": int(rss)})
print(json.dumps(row))
PY
  fi
  stop_target
  tail -n1 "$WORK/trials.jsonl" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("[bench]   %(workload)s %(target)-8s rep %(rep)s: %(rps).0f/s p50 %(p50_ms).2f ms p99 %(p99_ms).2f ms" % r + (" cpu/1k %.3f s" % r["cpu_per_1k"] if "cpu_per_1k" in r else "") + (" failed %d" % r["failed"] if r["failed"] else ""), file=sys.stderr)'
}

IFS=, read -r -a WL <<<"$WORKLOADS"
IFS=, read -r -a TG <<<"$TARGETS"
log "$REPS rep(s) x workloads ${WL[*]} x targets ${TG[*]}; ${DURATION}s trials, $CONNECTIONS connections, $KEYS keys, $STREAMS held streams; pinned=$PIN"
START=$(date +%s)
for rep in $(seq 1 "$REPS"); do
  for workload in "${WL[@]}"; do
    for target in "${TG[@]}"; do
      trial "$workload" "$target" "$rep"
    done
  done
done

mkdir -p "$(dirname "$OUT")"
python3 "$ROOT/bench/report.py" --trials "$WORK/trials.jsonl" --shape "$WORK/shape.json" --out "$OUT" \
  --meta "quick=$QUICK" "reps=$REPS" "duration_s=$DURATION" "warmup_s=$WARMUP" "connections=$CONNECTIONS" \
  "keys=$KEYS" "workers=$WORKERS" "streams=$STREAMS" "hold_s=$HOLD" "pinned=$PIN" "profile=$PROFILE" \
  "nproc=$(nproc)" "haproxy=$("$HAPROXY" -v | head -n1 | awk '{print $3}')" \
  "wrk=$(wrk -v 2>&1 | head -n1 | awk '{print $2}')" "git=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "gatewayd=$GATEWAYD" \
  "elapsed_s=$(( $(date +%s) - START ))"
log "results written to $OUT"
