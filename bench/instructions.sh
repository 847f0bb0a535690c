#!/usr/bin/env bash
# Instructions per request of gatewayd, counted by valgrind's callgrind: unlike CPU time, the count
# does not depend on what else the machine is doing, so two builds can be compared on a busy box.
# See docs/benchmarks.md ("Before and after").
#
#   bash bench/instructions.sh [--workloads a,b] [--seconds 10] [--connections 8] [--tls] [--no-build]
#                                [--annotate N] [--haproxy] [--models N] [--body-bytes N] [--openai-order]
#
# Workloads as in bench/proxy.sh: (a) keyed POST with a 1 KiB JSON answer, (b) keyed SSE of 64
# events. gatewayd (release, bounded policy, gap 2, skew 1.5, log level warn) runs under callgrind in
# front of four instant bch-drill workers; wrk drives it; the instructions executed while wrk ran
# (counters zeroed once gatewayd listens, dumped before it stops) are divided by the requests wrk
# completed. BENCH_GATEWAYD_BIN measures another build. --tls serves the data plane over TLS (an
# ECDSA P-256 certificate made with the openssl CLI, as bench/proxy_tls.sh does) and wrk speaks
# https over keep-alive connections, so the count includes rustls' record work. --no-build uses the
# release binaries already built. --annotate N prints, after each workload, the N functions that
# cost the traffic the most instructions (inclusive, per request), from callgrind_annotate.
# --haproxy counts HAProxy (Debian's, one thread) in gatewayd's place, configured as
# bench/proxy_tls.sh configures it, for a same-machine reference. --models N declares N models
# (`bch-sim`, `bch-sim-2`, ...) on every worker: with 2 or more the gateway reads each request's
# body up to its `model`, with 1 it reads none (the default, 0, declares none); every worker serves
# every model, so the request's pool is the same four workers whatever N, and the difference is what
# the models cost a request. --body-bytes N sends bodies of about N bytes (default 1024) and
# --openai-order puts `model` after `messages`, as openai-python does (bench/bodies.py). Needs
# valgrind and wrk (installed with apt-get when missing). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=instructions
# shellcheck source=bench/lib.sh
source bench/lib.sh
ROOT=$PWD
WORKLOADS=a,b
SECONDS_PER=10
CONNECTIONS=8
TLS=0
BUILD=1
ANNOTATE=0
TARGET=gatewayd
MODELS=0
BODY_ARGS=()
PORT_BASE=${BENCH_PORT_BASE:-28600}
while [[ $# -gt 0 ]]; do
  case $1 in
    --workloads) WORKLOADS=$2; shift ;;
    --seconds) SECONDS_PER=$2; shift ;;
    --connections) CONNECTIONS=$2; shift ;;
    --tls) TLS=1 ;;
    --no-build) BUILD=0 ;;
    --annotate) ANNOTATE=$2; shift ;;
    --haproxy) TARGET=haproxy ;;
    --models) MODELS=$2; shift ;;
    --body-bytes) BODY_ARGS+=(--bytes "$2"); shift ;;
    --openai-order) BODY_ARGS+=(--openai-order) ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/instructions.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $MODELS =~ ^[0-9]+$ ]] || die "--models takes a count (0, 1, 2, ...), got $MODELS"

missing=()
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing ${missing[*]}"
  SUDO=$([[ $(id -u) == 0 ]] && echo "" || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ $BUILD == 1 ]]; then
  log "building gatewayd and bch-drill (release)"
  cargo build --quiet --release -p gatewayd -p bch-drill
fi
TARGET_DIR=$(bench_target_dir)
GATEWAYD=${BENCH_GATEWAYD_BIN:-$TARGET_DIR/release/gatewayd}
DRILL=$TARGET_DIR/release/bch-drill

bench_workdir
PIN=()
[[ $(nproc) -ge 2 ]] && command -v taskset >/dev/null 2>&1 && PIN=(taskset -c 0)
LOAD=()
[[ ${#PIN[@]} -gt 0 ]] && LOAD=(taskset -c 1-$(($(nproc) - 1)))

python3 "$ROOT/bench/bodies.py" "$WORK" "${BODY_ARGS[@]}"
SCHEME=http
if [[ $TLS == 1 ]]; then
  SCHEME=https
  bench_certificates
fi
WORKER_BASE=$PORT_BASE GW=$((PORT_BASE + 10)) GW_CTL=$((PORT_BASE + 11))
"${LOAD[@]}" "$DRILL" workers --count 4 --base-port "$WORKER_BASE" --time-scale 0 --cache-blocks 0 \
  --max-batch 100000 >"$WORK/workers.log" 2>&1 &
PIDS+=($!)
wait_port $((WORKER_BASE + 3))
SERVER_LINES=
[[ $TLS == 1 ]] && SERVER_LINES=$(printf '\n[server.tls]\ncert_file = "%s"\nkey_file = "%s"\n' "$WORK/proxy.crt" "$WORK/proxy.key")
WORKER_LINES=
if [[ $MODELS -gt 0 ]]; then
  WORKER_LINES='models = ["bch-sim"'
  for ((m = 2; m <= MODELS; m++)); do WORKER_LINES+=", \"bch-sim-$m\""; done
  WORKER_LINES+=$']\n'
fi
bench_gatewayd_toml "$GW" "$GW_CTL" "$WORKER_BASE" "$SERVER_LINES" "$WORKER_LINES" >"$WORK/gatewayd.toml"
PROXY=("$GATEWAYD" --config "$WORK/gatewayd.toml")
if [[ $TARGET == haproxy ]]; then
  # As bench/proxy_tls.sh and bench/proxy.sh configure it, on one thread; a lower maxconn than
  # theirs, since valgrind keeps some of the process's file descriptors for itself.
  BIND="bind 127.0.0.1:$GW"
  [[ $TLS == 1 ]] && BIND="$BIND ssl crt $WORK/proxy.pem alpn http/1.1"
  bench_haproxy_cfg "$BIND" "$WORKER_BASE" $'    ssl-default-bind-options ssl-min-ver TLSv1.2\n' >"$WORK/haproxy.cfg"
  PROXY=("$(command -v haproxy || echo /usr/sbin/haproxy)" -db -f "$WORK/haproxy.cfg")
fi

# wrk for SECONDS on `workload`, then the counts so far dumped as `name`.
drive() {
  BENCH_BODY="$WORK/body_$1.json" BENCH_KEYS=1000 BENCH_OUT="$WORK/wrk-$1-$2.json" \
    "${LOAD[@]}" wrk -t1 -c"$CONNECTIONS" -d"${3}s" --timeout 30s -s "$ROOT/bench/keyed.lua" \
    "$SCHEME://127.0.0.1:$GW" >/dev/null || die "wrk failed"
  callgrind_control --dump="$2" "$pid" >/dev/null 2>&1
}

# "REQUESTS INSTRUCTIONS" of the run dumped as `name`.
counted() {
  local requests dump total
  requests=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["requests"])' "$WORK/wrk-$1-$2.json")
  dump=$(grep -l "^desc: Trigger: dump $2\$" "$WORK"/cg-"$1".out* | head -n1 || true)
  [[ -n $dump ]] || die "callgrind wrote no $2 dump for $1"
  total=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
  [[ -n $total && $requests -gt 0 ]] || die "no callgrind total or no requests for $1 ($2)"
  echo "$requests $total"
}

printf '%-10s %10s %16s %14s\n' workload requests instructions "per request"
for workload in ${WORKLOADS//,/ }; do
  RUST_LOG=warn "${PIN[@]}" valgrind --tool=callgrind --callgrind-out-file="$WORK/cg-$workload.out" \
    "${PROXY[@]}" >"$WORK/$TARGET-$workload.log" 2>&1 &
  pid=$!
  PIDS+=("$pid") # stopped on an early exit too
  wait_port "$GW" 120
  # Workers wait for their first probe before they take traffic: start once one has passed, so
  # no early 503 counts as a (cheap) request. (HAProxy answers its own 503 for /readiness until a
  # check passed.)
  python3 - "$GW" "$SCHEME" "$WORK/ca.crt" "$TARGET" <<'PY' || die "$TARGET not ready"
import ssl, sys, time, urllib.request
port, scheme, ca, target = sys.argv[1:5]
context = ssl.create_default_context(cafile=ca) if scheme == "https" else None
path = "/readiness" if target == "gatewayd" else "/health"
deadline = time.time() + 60
while time.time() < deadline:
    try:
        urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}{path}", timeout=2, context=context)
        sys.exit(0)
    except Exception:  # noqa: BLE001 - 503 or no answer: not ready yet
        time.sleep(0.1)
sys.exit(f"{target} not ready after 60 s")
PY
  # Count the traffic only: start-up is zeroed away, and the counts are dumped before shutdown, so
  # a slow run (fewer requests) does not spread start-up over fewer requests.
  callgrind_control --zero "$pid" >/dev/null 2>&1
  if [[ $TLS == 1 ]]; then
    # Each wrk run opens its connections with a full handshake, which would be spread over the
    # requests: a short run first, dumped on its own, then the full one. Both carry the same
    # handshakes, so the difference of their counts over the difference of their requests is
    # the cost of a request on a kept-alive TLS connection.
    drive "$workload" short $(((SECONDS_PER + 3) / 4))
    read -r short_requests short_total < <(counted "$workload" short)
  fi
  drive "$workload" traffic "$SECONDS_PER"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  read -r requests total < <(counted "$workload" traffic)
  dump=$(grep -l '^desc: Trigger: dump traffic' "$WORK"/cg-"$workload".out* | head -n1)
  if [[ $TLS == 1 ]]; then
    (( requests > short_requests )) || die "the full run served no more requests than the short one"
    printf '%-10s %10d %16d %14d  (handshakes left out: %d requests, %d instructions in the short run)\n' \
      "$workload" "$requests" "$total" $(((total - short_total) / (requests - short_requests))) \
      "$short_requests" "$short_total"
  else
    printf '%-10s %10d %16d %14d\n' "$workload" "$requests" "$total" $((total / requests))
  fi
  if [[ $ANNOTATE -gt 0 ]]; then
    # Inclusive counts, per request, of the costliest functions: what a request's instructions go
    # to (with --tls, the difference between the two runs, function by function, as above).
    inclusive() { callgrind_annotate --inclusive=yes --auto=no --threshold=100 "$1" 2>/dev/null; }
    short_dump=/dev/null
    [[ $TLS == 1 ]] && short_dump=$(grep -l '^desc: Trigger: dump short$' "$WORK"/cg-"$workload".out* | head -n1)
    python3 - "$ANNOTATE" "$requests" "${short_requests:-0}" <(inclusive "$dump") \
      <([[ $short_dump == /dev/null ]] || inclusive "$short_dump") <<'PY'
import re, sys
top, requests, short_requests = (int(a) for a in sys.argv[1:4])
def counts(path):
    found = {}
    for line in open(path, encoding="utf-8", errors="replace"):
        match = re.match(r"\s*([\d,]+) (?:\([^)]*\) )?(.*?)(?: \[[^]]*\])?$", line)
        if match and ":" in match.group(2):
            found[match.group(2)] = int(match.group(1).replace(",", ""))
    return found
full, short = counts(sys.argv[4]), counts(sys.argv[5])
per = {name: (n - short.get(name, 0)) / (requests - short_requests) for name, n in full.items()}
for name, n in sorted(per.items(), key=lambda item: -item[1])[:top]:
    print(f"  {n:12.0f}  {name[:150]}")
PY
  fi
done
