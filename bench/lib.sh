# Shared plumbing of the bench/ scripts and tests/sim/ab.sh; sourced with BENCH_NAME set (the
# prefix of log lines), from the repository root where bench_target_dir is used.
#
#   log MSG / die MSG           timestamped progress on stderr / error and exit 1
#   bench_target_dir            cargo's target directory (honours CARGO_TARGET_DIR and config)
#   bench_workdir               makes $WORK (removed on exit) and kills every pid in PIDS on exit
#   port_free PORT              true when nothing listens on 127.0.0.1:PORT
#   wait_port PORT [SECONDS]    waits (default 10 s) until something listens on 127.0.0.1:PORT
#   wait_probed URL N [SECONDS] waits (default 30 s) until the gateway whose control plane is at
#                               URL (http://host:port) lists N healthy workers: new workers take
#                               traffic only once their first probe passed
#   bench_certificates          writes $WORK/ca.crt and the proxies' $WORK/proxy.crt / proxy.key
#                               (IP 127.0.0.1, ECDSA P-256) and proxy.pem (both, HAProxy's crt)
#   bench_gatewayd_toml LISTEN CONTROL WORKER_BASE [SERVER_LINES] [WORKER_LINES]
#                               prints the single-core comparisons' gatewayd configuration: four
#                               workers sim-0..3 at ports WORKER_BASE.., the bounded policy (gap 2,
#                               skew 1.5), log level warn; SERVER_LINES go under [server] (its TLS
#                               section too), WORKER_LINES into every [[workers]] table (both
#                               printed with printf's %b, so `\n` in them is a line break)
#   bench_haproxy_cfg BIND WORKER_BASE [GLOBAL_LINES]
#                               prints HAProxy's configuration for the same comparisons: one thread,
#                               the frontend's `bind` line BIND, the routing key hashed on a
#                               consistent ring with a balance factor of 150 %, the same four workers

log() { printf '[%s %(%H:%M:%S)T] %s\n' "$BENCH_NAME" -1 "$*" >&2; }
die() { echo "$0: error: $*" >&2; exit 1; }

# Certificates made with the openssl CLI, never downloaded: a CA and the proxies' certificate for IP
# 127.0.0.1, ECDSA P-256 (the cheapest signature every peer offers; bench/proxy_tls.sh's handshake
# workload measures it).
bench_certificates() {
  ssl() { openssl "$@" >>"$WORK/openssl.log" 2>&1 || die "openssl $1 failed (log: $WORK/openssl.log)"; }
  ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$WORK/ca.key" -out "$WORK/ca.crt" \
    -days 2 -subj "/CN=bench CA" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign"
  ssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$WORK/proxy.key" -out "$WORK/proxy.csr" -subj "/CN=proxy"
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$WORK/proxy.ext"
  ssl x509 -req -in "$WORK/proxy.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" -CAcreateserial -days 2 \
    -out "$WORK/proxy.crt" -extfile "$WORK/proxy.ext"
  cat "$WORK/proxy.crt" "$WORK/proxy.key" >"$WORK/proxy.pem"
}

bench_gatewayd_toml() {
  local i
  printf '[server]\nlisten = "127.0.0.1:%s"\ncontrol_listen = "127.0.0.1:%s"\n%b\n' "$1" "$2" "${4:-}"
  printf '[policy]\nkind = "bounded_consistent_hashing"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\n[log]\nlevel = "warn"\n'
  for i in 0 1 2 3; do
    printf '\n[[workers]]\nname = "sim-%s"\nurl = "http://127.0.0.1:%s"\n%b' "$i" $(($3 + i)) "${5:-}"
  done
}

bench_haproxy_cfg() {
  local i
  printf 'global\n    maxconn 4000\n    nbthread 1\n%b' "${3:-}"
  printf 'defaults\n    mode http\n    timeout connect 2s\n    timeout client 5m\n    timeout server 5m\n'
  printf '    timeout http-keep-alive 90s\nfrontend bench\n    %s\n    default_backend workers\n' "$1"
  printf 'backend workers\n    balance hdr(X-SMG-Routing-Key)\n    hash-type consistent\n    hash-balance-factor 150\n'
  for i in 0 1 2 3; do
    printf '    server sim-%s 127.0.0.1:%s check inter 2s maxconn 10000\n' "$i" $(($2 + i))
  done
}

bench_target_dir() {
  cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])'
}

PIDS=()
bench_cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  [[ -n ${WORK:-} ]] && rm -rf "$WORK"
  return 0
}
bench_workdir() {
  WORK=$(mktemp -d "/tmp/bch-$BENCH_NAME.XXXXXX")
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  local tries=$(( ${2:-10} * 20 )) i
  for ((i = 0; i < tries; i++)); do
    port_free "$1" || return 0
    sleep 0.05
  done
  die "nothing listening on 127.0.0.1:$1 after ${2:-10} s"
}
wait_probed() {
  python3 - "$1" "$2" "${3:-30}" <<'PY' || die "$1: fewer than $2 workers passed their first probe after ${3:-30} s"
import json, sys, time, urllib.request
url, want, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.time() + limit
while time.time() < deadline:
    try:
        workers = json.load(urllib.request.urlopen(f"{url}/admin/workers", timeout=2))["workers"]
        if sum(1 for w in workers if w["healthy"]) >= want:
            sys.exit(0)
    except Exception:  # noqa: BLE001 - any failure is "not ready yet"
        pass
    time.sleep(0.05)
sys.exit(1)
PY
}
