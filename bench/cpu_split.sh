#!/usr/bin/env bash
# Where a proxy's CPU per request goes: user and system time, voluntary context switches and
# syscalls per request, gatewayd and HAProxy interleaved, one core each. bench/proxy.sh gives the
# total; this splits it, because most of a proxy's CPU on loopback is the kernel's (socket reads
# and writes, waking the peer, epoll) and instruction counts (bench/instructions.sh) see only the
# user part. See docs/benchmarks.md ("Where (b)'s CPU goes").
#
#   bash bench/cpu_split.sh [--workload a|b] [--seconds 6] [--connections 64] [--reps 2]
#                           [--targets gatewayd,haproxy] [--syscalls] [--no-build]
#
# The proxy runs pinned to CPU 0 in front of four instant bch-drill workers; wrk (one thread) and
# the workers share the other CPUs, as in bench/proxy.sh. CPU is read from /proc/PID/stat around a
# wrk run that follows a 2 s warm-up; context switches are summed over the proxy's threads.
# --syscalls adds a run under `strace -f -c` per target (strace slows the proxy several times, so
# its CPU figures are not printed; only the syscalls per request). BENCH_GATEWAYD_BIN measures
# another build. Needs wrk, haproxy (and strace with --syscalls). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=cpu-split
# shellcheck source=bench/lib.sh
source bench/lib.sh
WORKLOAD=b SECONDS_PER=6 CONNECTIONS=64 REPS=2 TARGETS=gatewayd,haproxy SYSCALLS=0 BUILD=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --workload) WORKLOAD=$2; shift ;;
    --seconds) SECONDS_PER=$2; shift ;;
    --connections) CONNECTIONS=$2; shift ;;
    --reps) REPS=$2; shift ;;
    --targets) TARGETS=$2; shift ;;
    --syscalls) SYSCALLS=1 ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
[[ $WORKLOAD == a || $WORKLOAD == b ]] || die "--workload is a or b, got $WORKLOAD"
[[ $(nproc) -ge 2 ]] || die "needs two CPUs: the proxy gets one, the load the others"
for tool in wrk haproxy taskset; do command -v "$tool" >/dev/null 2>&1 || die "needs $tool"; done
[[ $SYSCALLS == 0 ]] || command -v strace >/dev/null 2>&1 || die "--syscalls needs strace"
if [[ $BUILD == 1 ]]; then
  log "building gatewayd and bch-drill (release)"
  cargo build --quiet --release -p gatewayd -p bch-drill
fi
TARGET_DIR=$(bench_target_dir)
GATEWAYD=${BENCH_GATEWAYD_BIN:-$TARGET_DIR/release/gatewayd}
DRILL=$TARGET_DIR/release/bch-drill
HAPROXY=$(command -v haproxy)
bench_workdir
python3 bench/bodies.py "$WORK" >/dev/null
PORT_BASE=${BENCH_PORT_BASE:-28700}
WORKER_BASE=$PORT_BASE GW=$((PORT_BASE + 10)) GW_CTL=$((PORT_BASE + 11))
LOAD=(taskset -c "1-$(($(nproc) - 1))")
"${LOAD[@]}" "$DRILL" workers --count 4 --base-port "$WORKER_BASE" --time-scale 0 --cache-blocks 0 \
  --max-batch 100000 >"$WORK/workers.log" 2>&1 &
PIDS+=($!)
wait_port $((WORKER_BASE + 3))
bench_gatewayd_toml "$GW" "$GW_CTL" "$WORKER_BASE" >"$WORK/gatewayd.toml"
bench_haproxy_cfg "bind 127.0.0.1:$GW" "$WORKER_BASE" >"$WORK/haproxy.cfg"

# Starts `target` pinned to CPU 0 (under `strace -f -c` when $2 is a file) and waits until it
# routes; the pid it prints is the proxy's own.
start() {
  local wrap=(taskset -c 0)
  [[ -n ${2:-} ]] && wrap+=(strace -f -c -o "$2")
  case $1 in
    gatewayd) RUST_LOG=warn "${wrap[@]}" "$GATEWAYD" --config "$WORK/gatewayd.toml" >"$WORK/$1.log" 2>&1 & ;;
    haproxy) "${wrap[@]}" "$HAPROXY" -db -f "$WORK/haproxy.cfg" >"$WORK/$1.log" 2>&1 & ;;
    *) die "unknown target $1" ;;
  esac
  local wrapper=$!
  PIDS+=("$wrapper")
  wait_port "$GW" 60
  local pid=$wrapper
  [[ -n ${2:-} ]] && pid=$(pgrep -P "$wrapper" | head -n1)
  # Until a probe passed, a proxy answers 503 (cheap): warm up until it routes.
  local i
  for ((i = 0; i < 200; i++)); do
    curl -sf -o /dev/null -H 'X-SMG-Routing-Key: warm' -H 'content-type: application/json' \
      --data-binary @"$WORK/body_$WORKLOAD.json" "http://127.0.0.1:$GW/v1/chat/completions" && break
    sleep 0.05
  done
  echo "$pid"
}
stop() {
  kill -TERM "$1" 2>/dev/null || true
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
  for ((i = 0; i < 100; i++)); do port_free "$GW" && break; sleep 0.05; done
}
drive() { # seconds outfile
  BENCH_BODY="$WORK/body_$WORKLOAD.json" BENCH_KEYS=1000 BENCH_OUT="$2" "${LOAD[@]}" \
    wrk -t1 -c"$CONNECTIONS" -d"${1}s" --timeout 10s -s bench/keyed.lua "http://127.0.0.1:$GW" >/dev/null
}
# "user_ticks sys_ticks voluntary_switches" of a process, its threads' switches summed.
sample() {
  local ticks switches=0 task
  ticks=$(awk '{ sub(/^.*\) /, ""); print $12, $13 }' "/proc/$1/stat")
  for task in /proc/"$1"/task/*; do
    switches=$((switches + $(awk '/^voluntary_ctxt_switches/ { print $2 }' "$task/status" 2>/dev/null || echo 0)))
  done
  echo "$ticks $switches"
}
requests() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["requests"])' "$1"; }

HZ=$(getconf CLK_TCK)
printf '%-9s %4s %9s %12s %12s %12s %14s\n' target rep requests "user us/req" "sys us/req" "total us/req" "vol. switches"
for ((rep = 1; rep <= REPS; rep++)); do
  for target in ${TARGETS//,/ }; do
    pid=$(start "$target")
    drive 2 "$WORK/warm.json"
    read -r u0 s0 v0 < <(sample "$pid")
    drive "$SECONDS_PER" "$WORK/run.json"
    read -r u1 s1 v1 < <(sample "$pid")
    n=$(requests "$WORK/run.json")
    stop "$pid"
    awk -v t="$target" -v r="$rep" -v n="$n" -v hz="$HZ" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v v=$((v1 - v0)) \
      'BEGIN { printf "%-9s %4d %9d %12.1f %12.1f %12.1f %14.2f\n", t, r, n, u / hz / n * 1e6, s / hz / n * 1e6, (u + s) / hz / n * 1e6, v / n }'
  done
done

if [[ $SYSCALLS == 1 ]]; then
  for target in ${TARGETS//,/ }; do
    pid=$(start "$target" "$WORK/strace-$target.txt")
    # Counted from the proxy's start: the warm-up requests are counted too, and divided by.
    drive "$SECONDS_PER" "$WORK/strace-run.json"
    n=$(requests "$WORK/strace-run.json")
    stop "$pid"
    for ((i = 0; i < 100; i++)); do [[ -s $WORK/strace-$target.txt ]] && break; sleep 0.05; done
    echo "syscalls per request, $target ($n requests under strace; idle timers included):"
    # strace's columns: % time, seconds, usecs/call, calls, [errors,] syscall. A failed read is
    # one that found nothing (EAGAIN): a wasted system call.
    awk -v n="$n" '$1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" && $4 / n >= 0.05 {
        failed = NF == 6 ? sprintf("  (%.2f failed)", $5 / n) : ""
        printf "  %-14s %6.2f%s\n", $NF, $4 / n, failed
      }' "$WORK/strace-$target.txt" | sort -k2 -rn
  done
fi
