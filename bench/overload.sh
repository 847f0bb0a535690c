#!/usr/bin/env bash
# Overload benchmark: an open-loop Poisson storm at twice the fleet's measured capacity through
# gatewayd without admission, gatewayd with admission, and HAProxy with `maxconn` per server and
# `timeout queue` (the anchor), interleaved on the same simulated workers; then the bounded policy's
# A/B shape under that overload with admission on. See docs/benchmarks.md, "Overload".
#
#   bash bench/overload.sh              # full run (~15 min after the build): 60 s storms
#   bash bench/overload.sh --quick      # smoke (~2 min after the build): 10 s storms, debug build
#
# Options: --targets gatewayd,admission,haproxy,ab (legs to run; ab = the A/B shape), --reps N,
# --duration S, --workers N, --batch N (each worker's batch and the cap), --time-scale X,
# --keys N, --prefix-tokens N, --max-tokens N, --factor F (storm rate = F x capacity),
# --capacity R (skip the sweep), --queue-timeout-ms MS (default 2 x unloaded p99 TTFT),
# --max-queued N, --retry-after-ms MS, --ab-reps N, --ab-duration S, --seed S, --out FILE,
# --profile P (cargo profile; release by default, dev in --quick), --no-install.
# Everything listens on 127.0.0.1 only; every process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=overload
# shellcheck source=bench/lib.sh
source bench/lib.sh

QUICK=0 REPS=1 DURATION=60 WORKERS=4 BATCH=4 SCALE=1 KEYS=16 PREFIX=512 MAX_TOKENS=64 FACTOR=2
TARGETS=gatewayd,admission,haproxy,ab CAPACITY="" QUEUE_TIMEOUT="" MAX_QUEUED=1024 RETRY_AFTER=1000
AB_REPS=3 AB_DURATION=30 SEED=$RANDOM OUT="" PROFILE="" INSTALL=1
SWEEP_DURATION=15 SWEEP_ARRIVAL=poisson UNLOADED=32
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --targets) TARGETS=$2; shift ;;
    --reps) REPS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --workers) WORKERS=$2; shift ;;
    --batch) BATCH=$2; shift ;;
    --time-scale) SCALE=$2; shift ;;
    --keys) KEYS=$2; shift ;;
    --prefix-tokens) PREFIX=$2; shift ;;
    --max-tokens) MAX_TOKENS=$2; shift ;;
    --factor) FACTOR=$2; shift ;;
    --capacity) CAPACITY=$2; shift ;;
    --queue-timeout-ms) QUEUE_TIMEOUT=$2; shift ;;
    --max-queued) MAX_QUEUED=$2; shift ;;
    --retry-after-ms) RETRY_AFTER=$2; shift ;;
    --ab-reps) AB_REPS=$2; shift ;;
    --ab-duration) AB_DURATION=$2; shift ;;
    --seed) SEED=$2; shift ;;
    --out) OUT=$2; shift ;;
    --profile) PROFILE=$2; shift ;;
    --no-install) INSTALL=0 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/overload.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $QUICK == 1 ]]; then
  DURATION=10 SWEEP_DURATION=3 SWEEP_ARRIVAL=constant UNLOADED=12 AB_REPS=1 AB_DURATION=5
  PROFILE=${PROFILE:-dev}
fi
PROFILE=${PROFILE:-release}
SUFFIX=""; [[ $QUICK == 1 ]] && SUFFIX=-quick
OUT=${OUT:-bench/results/overload$SUFFIX.json}
wants() { [[ ,$TARGETS, == *,$1,* ]]; }
index_of() { case $1 in gatewayd) echo 2 ;; admission) echo 3 ;; haproxy) echo 4 ;; esac; }
IFS=, read -r -a TG <<<"$TARGETS"
LEGS=()
for t in "${TG[@]}"; do
  case $t in gatewayd|admission|haproxy) LEGS+=("$t") ;; ab) ;; *) die "unknown target $t (gatewayd, admission, haproxy, ab)" ;; esac
done

if wants haproxy && ! command -v haproxy >/dev/null 2>&1 && [[ ! -x /usr/sbin/haproxy ]]; then
  [[ $INSTALL == 1 ]] || die "missing haproxy (and --no-install given)"
  command -v apt-get >/dev/null 2>&1 || die "missing haproxy; install it (no apt-get here)"
  sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  log "installing haproxy"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq haproxy >/dev/null
fi
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

log "building gatewayd and bch-drill (profile $PROFILE)"
cargo build --quiet --profile "$PROFILE" -p gatewayd -p bch-drill --bins
BIN=$(bench_target_dir)/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
GATEWAYD=${BENCH_GATEWAYD_BIN:-$BIN/gatewayd}
DRILL=$BIN/bch-drill
bench_workdir
# An open-loop storm holds a connection per outstanding request: without admission that is the
# whole backlog (rate x the slowest answer).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# HAProxy needs two descriptors a connection and refuses to start with a maxconn it cannot hold.
NOFILE=$(ulimit -n); [[ $NOFILE == unlimited ]] && NOFILE=1000000
HA_MAXCONN=$(( NOFILE / 2 - 100 > 20000 ? 20000 : NOFILE / 2 - 100 ))

# ---- the fleet: simulated workers whose batch is the cap ----------------------------------------
"$DRILL" workers --count "$WORKERS" --base-port 0 --max-batch "$BATCH" --time-scale "$SCALE" \
  >"$WORK/workers" 2>"$WORK/workers.log" &
PIDS+=($!)
for _ in $(seq 1 100); do [[ $(wc -l <"$WORK/workers") -ge $WORKERS ]] && break; sleep 0.1; done
[[ $(wc -l <"$WORK/workers") -ge $WORKERS ]] || die "the simulated workers did not start: $(cat "$WORK/workers.log")"
mapfile -t WORKER_URLS < <(awk '{print $2}' "$WORK/workers")
log "$WORKERS workers of batch $BATCH at time scale $SCALE: ${WORKER_URLS[*]}"
STORM=(--keys "$KEYS" --prefix-tokens "$PREFIX" --suffix-tokens 32 --max-tokens "$MAX_TOKENS" --prefix-scope key)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
write_gatewayd_config() { # file with_admission
  {
    printf '[server]\nlisten = "127.0.0.1:0"\ncontrol_listen = "127.0.0.1:0"\nmax_connections = 20000\n\n'
    printf '[policy]\nkind = "bounded_consistent_hashing"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\n'
    if [[ $2 == 1 ]]; then
      printf '[admission]\nmax_in_flight_per_worker = %s\nqueue_timeout_ms = %s\nmax_queued = %s\nretry_after_ms = %s\n\n' \
        "$BATCH" "$QUEUE_TIMEOUT" "$MAX_QUEUED" "$RETRY_AFTER"
    fi
    printf '[log]\nlevel = "warn"\n'
    local i
    for i in "${!WORKER_URLS[@]}"; do printf '\n[[workers]]\nname = "sim-%s"\nurl = "%s"\n' "$i" "${WORKER_URLS[$i]}"; done
  } >"$1"
}
write_haproxy_config() { # file port
  # The routing key hashed onto a consistent ring with bounded load, as bench/proxy.sh configures
  # it; at most BATCH requests on a server, the rest wait in its queue up to the queue timeout, then
  # get HAProxy's own 503, to which a Retry-After is added as an operator would.
  {
    cat <<CFG
global
    maxconn $HA_MAXCONN

defaults
    mode http
    maxconn $HA_MAXCONN
    timeout connect 2s
    timeout client 5m
    timeout server 5m
    timeout queue ${QUEUE_TIMEOUT}ms
    timeout http-keep-alive 90s

frontend bench
    bind 127.0.0.1:$2
    default_backend workers
    http-after-response set-header Retry-After $(( (RETRY_AFTER + 999) / 1000 )) if { status 503 }

backend workers
    balance hdr(X-SMG-Routing-Key)
    hash-type consistent
    hash-balance-factor 150
CFG
    local i
    for i in "${!WORKER_URLS[@]}"; do
      printf '    server sim-%s %s check inter 2s maxconn %s\n' "$i" "${WORKER_URLS[$i]#http://}" "$BATCH"
    done
  } >"$1"
}

CURRENT_PID="" URL="" CONTROL=""
start_gatewayd() { # config -> URL, CONTROL, CURRENT_PID
  : >"$WORK/gatewayd.log"
  RUST_LOG=warn "$GATEWAYD" --config "$1" >"$WORK/gatewayd.log" 2>&1 &
  CURRENT_PID=$!; PIDS+=("$CURRENT_PID")
  local line
  for _ in $(seq 1 300); do grep -q "control plane" "$WORK/gatewayd.log" && break; sleep 0.1; done
  line=$(grep -m1 "control plane" "$WORK/gatewayd.log") || die "gatewayd did not start ($1): $(tail -n 5 "$WORK/gatewayd.log")"
  URL=$(sed -n 's/.*data plane \(http:\/\/[^ ]*\).*/\1/p' <<<"$line")
  CONTROL=$(sed -n 's/.*control plane \(http:\/\/[^ ]*\).*/\1/p' <<<"$line")
  wait_probed "$CONTROL" "$WORKERS"
}
start_target() { # leg -> URL, CONTROL, CURRENT_PID
  case $1 in
    gatewayd) start_gatewayd "$WORK/gatewayd.toml" ;;
    admission)
      if [[ $ADMISSION_VIA == PUT* ]]; then
        start_gatewayd "$WORK/gatewayd.toml"
        ensure_admission "$CONTROL" put || die "gatewayd did not put admission in force through PUT /admin/policy"
      else
        start_gatewayd "$WORK/admission.toml"
        ensure_admission "$CONTROL" check || die "gatewayd did not put [admission] in force"
      fi ;;
    haproxy)
      local port; port=$(free_port)
      write_haproxy_config "$WORK/haproxy.cfg" "$port"
      "$HAPROXY" -db -f "$WORK/haproxy.cfg" >>"$WORK/haproxy.log" 2>&1 &
      CURRENT_PID=$!; PIDS+=("$CURRENT_PID")
      for _ in $(seq 1 300); do
        port_free "$port" || break
        kill -0 "$CURRENT_PID" 2>/dev/null || die "HAProxy did not start: $(tail -n 3 "$WORK/haproxy.log")"
        sleep 0.1
      done
      wait_port "$port" 1
      URL="http://127.0.0.1:$port" CONTROL="" ;;
  esac
}
ensure_admission() { # control put|check: (put the admission leg's settings, then) read them back
  python3 - "$1" "$2" "$BATCH" "$QUEUE_TIMEOUT" "$MAX_QUEUED" "$RETRY_AFTER" <<'PY'
import json, sys, urllib.request
control, how, cap, timeout, queued, retry = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
want = {"max_in_flight_per_worker": cap, "queue_timeout_ms": timeout, "max_queued": queued, "retry_after_ms": retry}
if how == "put":
    req = urllib.request.Request(f"{control}/admin/policy", data=json.dumps({"admission": want}).encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()
# A gateway that answers a change but does not keep it would run this leg without admission.
got = json.load(urllib.request.urlopen(f"{control}/admin/policy", timeout=5)).get("admission") or {}
if any(got.get(k) != v for k, v in want.items()):
    sys.exit(f"GET /admin/policy has admission {json.dumps(got)}, not {json.dumps(want)}")
PY
}
stop_target() {
  [[ -n $CURRENT_PID ]] && { kill "$CURRENT_PID" 2>/dev/null || true; wait "$CURRENT_PID" 2>/dev/null || true; }
  CURRENT_PID=""
}
wait_workers_idle() { # every worker's running + waiting back at 0 (a leg's stragglers are gone)
  python3 - "${WORKER_URLS[@]}" <<'PY' || log "warning: the workers still hold requests after 60 s"
import sys, time, urllib.request
sys.dont_write_bytecode = True  # no bench/__pycache__ left in the tree
sys.path.insert(0, "bench")
from overload import gauges
deadline = time.time() + 60
while time.time() < deadline:
    g = [gauges(urllib.request.urlopen(f"{u}/metrics", timeout=2).read().decode()) for u in sys.argv[1:]]
    if all((x["running"] or 0) + (x["waiting"] or 0) == 0 for x in g):
        sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
PY
}
field() { # file dotted.key -> the JSON value
  python3 -c 'import functools, json, sys; print(functools.reduce(lambda d, k: d[k], sys.argv[2].split("."), json.load(open(sys.argv[1]))))' "$1" "$2"
}

# Before the calibration, so that a gatewayd without admission fails fast: the admission leg reads
# [admission] from its file; a gatewayd that refuses the section gets the same settings hot,
# through the control plane (the report records which way they came); ab always puts them so.
ADMISSION_VIA="[admission] in the configuration file"
given=$QUEUE_TIMEOUT; QUEUE_TIMEOUT=${QUEUE_TIMEOUT:-1000}
write_gatewayd_config "$WORK/gatewayd.toml" 0
write_gatewayd_config "$WORK/admission.toml" 1
if wants admission && ! "$GATEWAYD" check-config "$WORK/admission.toml" >"$WORK/check.txt" 2>&1; then
  ADMISSION_VIA="PUT /admin/policy"
  log "this gatewayd refuses [admission] ($(tail -n 1 "$WORK/check.txt")): the admission leg puts it with PUT /admin/policy"
fi
if wants ab || [[ $ADMISSION_VIA == PUT* ]]; then
  start_gatewayd "$WORK/gatewayd.toml"
  ensure_admission "$CONTROL" put || die "this gatewayd does not keep admission set through PUT /admin/policy; run --targets gatewayd,haproxy"
  stop_target
fi
QUEUE_TIMEOUT=$given

# ---- unloaded TTFT and capacity, through gatewayd without admission -----------------------------
start_gatewayd "$WORK/gatewayd.toml"
log "unloaded: $UNLOADED requests one at a time"
"$DRILL" storm --gateway "$URL" --groups "$UNLOADED" --siblings 1 --concurrency 1 "${STORM[@]}" \
  --seed "$SEED" --out "$WORK/unloaded.json" --records "$WORK/unloaded.records" >"$WORK/unloaded.txt"
UNLOADED_P99=$(python3 -c "print(round($(field "$WORK/unloaded.json" ttft.p99_ms), 1))")
# One slot serves one request per mean answer time: the fleet's slots over it is the first guess.
GUESS=$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; t=sum(x["total_ms"] for x in r)/len(r); print(round(int(sys.argv[2])*int(sys.argv[3])*1000/t, 1))' \
  "$WORK/unloaded.records" "$WORKERS" "$BATCH")
QUEUE_TIMEOUT=${QUEUE_TIMEOUT:-$(python3 -c "import math; print(math.ceil(2 * $UNLOADED_P99))")}
# The TTFT objective, whole milliseconds: what an admitted request may take (the goal's limit).
LIMIT=$(python3 -c "import math; print(math.ceil(2 * $UNLOADED_P99 + $QUEUE_TIMEOUT))")
log "unloaded TTFT p99 ${UNLOADED_P99} ms; queue timeout ${QUEUE_TIMEOUT} ms; TTFT SLO ${LIMIT} ms; slots/answer time ${GUESS} req/s"
if [[ -n $CAPACITY ]]; then
  CAPACITY_FROM="given"
else
  START=$(python3 -c "print(round($GUESS / 2, 1))")
  log "sweep from $START req/s, x1.25 a step, ${SWEEP_DURATION} s each ($SWEEP_ARRIVAL)"
  "$DRILL" sweep --gateway "$URL" --slo-ttft-ms "$LIMIT" --start-rate "$START" --factor 1.25 --max-steps 8 \
    --saturated-steps 2 --duration "$SWEEP_DURATION" --arrival "$SWEEP_ARRIVAL" "${STORM[@]}" --seed $((SEED + 1)) \
    --out "$WORK/sweep.json" >"$WORK/sweep.txt"
  cat "$WORK/sweep.txt" >&2
  CAPACITY=$(field "$WORK/sweep.json" capacity_rps)
  CAPACITY_FROM="bch-drill sweep, best goodput"
fi
stop_target
RATE=$(python3 -c "print(round($FACTOR * $CAPACITY, 1))")
write_gatewayd_config "$WORK/admission.toml" 1

# ---- the legs, interleaved: repetition 1 in order, 2 reversed, ... -------------------------------
: >"$WORK/trials.jsonl"
wait_workers_idle
for rep in $(seq 1 "$REPS"); do
  order=("${LEGS[@]}")
  if (( rep % 2 == 0 )); then
    order=(); for ((i = ${#LEGS[@]} - 1; i >= 0; i--)); do order+=("${LEGS[$i]}"); done
  fi
  for leg in "${order[@]}"; do
    # Each leg's prompts differ (the seed), so no leg finds the one before it in the workers' caches.
    seed=$((SEED + 10 * rep + $(index_of "$leg")))
    log "rep $rep, $leg: open loop at $RATE req/s (poisson) for ${DURATION} s"
    start_target "$leg"
    python3 bench/overload.py sample --out "$WORK/samples-$leg-$rep.jsonl" "${WORKER_URLS[@]}" &
    SAMPLER=$!; PIDS+=("$SAMPLER")
    "$DRILL" storm --gateway "$URL" ${CONTROL:+--control "$CONTROL"} --rate "$RATE" --arrival poisson \
      --duration "$DURATION" --slo-ttft-ms "$LIMIT" "${STORM[@]}" --seed "$seed" \
      --out "$WORK/storm-$leg-$rep.json" --records "$WORK/records-$leg-$rep.jsonl" >"$WORK/storm-$leg-$rep.txt" \
      || die "the storm through $leg failed: $(tail -n 3 "$WORK/storm-$leg-$rep.txt")"
    kill "$SAMPLER"; wait "$SAMPLER" 2>/dev/null || true
    grep -E '^  (answers|goodput|TTFT)' "$WORK/storm-$leg-$rep.txt" >&2 || true
    stop_target
    python3 bench/overload.py leg --storm "$WORK/storm-$leg-$rep.json" --records "$WORK/records-$leg-$rep.jsonl" \
      --samples "$WORK/samples-$leg-$rep.jsonl" --target "$leg" --rep "$rep" --duration "$DURATION" --cap "$BATCH" \
      >>"$WORK/trials.jsonl"
    wait_workers_idle
  done
done

# ---- the bounded policy's A/B shape under the same overload, admission on -----------------------
AB_ARGS=()
if wants ab; then
  # Each cell puts the whole admission object through PUT /admin/policy.
  start_gatewayd "$WORK/gatewayd.toml"
  ensure_admission "$CONTROL" put || die "gatewayd does not keep admission set through PUT /admin/policy (run --targets gatewayd,haproxy)"
  adm="max_in_flight_per_worker=$BATCH:queue_timeout_ms=$QUEUE_TIMEOUT:max_queued=$MAX_QUEUED:retry_after_ms=$RETRY_AFTER"
  log "A/B: bounded vs consistent_hashing, admission on, $AB_REPS rep(s) of ${AB_DURATION} s at $RATE req/s"
  "$DRILL" ab --gateway "$URL" --control "$CONTROL" --cells "bounded:$adm,strict:$adm" --reps "$AB_REPS" \
    --rate "$RATE" --arrival poisson --duration "$AB_DURATION" --slo-ttft-ms "$LIMIT" "${STORM[@]}" \
    --seed $((SEED + 100)) --out "$WORK/ab.json" >"$WORK/ab.txt" 2>"$WORK/ab.log" \
    || die "the A/B run failed: $(tail -n 3 "$WORK/ab.log")"
  stop_target
  AB_ARGS=(--ab "$WORK/ab.json")
fi

mkdir -p "$(dirname "$OUT")"
[[ -s $WORK/trials.jsonl ]] || [[ ${#AB_ARGS[@]} -gt 0 ]] || die "no leg ran"
python3 bench/overload.py report --trials "$WORK/trials.jsonl" "${AB_ARGS[@]}" --out "$OUT" --meta \
  "quick=$QUICK" "reps=$REPS" "duration_s=$DURATION" "workers=$WORKERS" "batch=$BATCH" "cap=$BATCH" \
  "time_scale=$SCALE" "keys=$KEYS" "prefix_tokens=$PREFIX" "max_tokens=$MAX_TOKENS" "factor=$FACTOR" \
  "capacity_rps=$CAPACITY" "capacity_from=$CAPACITY_FROM" "rate=$RATE" "arrival=poisson" \
  "unloaded_ttft_p99_ms=$UNLOADED_P99" "queue_timeout_ms=$QUEUE_TIMEOUT" "ttft_limit_ms=$LIMIT" \
  "max_queued=$MAX_QUEUED" "retry_after_ms=$RETRY_AFTER" "admission_via=$ADMISSION_VIA" "seed=$SEED" "profile=$PROFILE" "nproc=$(nproc)" \
  "haproxy=$("$HAPROXY" -v 2>/dev/null | awk 'NR == 1 {print $3}')" "git=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
log "results written to $OUT"
