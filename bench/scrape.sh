#!/usr/bin/env bash
# Load-scraping cost: gatewayd's CPU with 64 workers scraped at 10 Hz ([load] source =
# "worker_metrics") against the same gatewayd with scraping off (source = "local"), in alternating
# phases of one run, no request traffic. The workers are bench/metrics_server.py, a vLLM-sized
# (~40 KB) exposition each by default. Health probes are slowed to one a minute per worker and
# not waited for (both phases alike). See docs/benchmarks.md.
#
#   bash bench/scrape.sh                                   # 3 rounds of 10 s phases (~70 s)
#   bash bench/scrape.sh --quick                           # 1 round of 3 s phases (smoke)
#   bash bench/scrape.sh --workers 10000 --body small      # fleet scale, paced by max_scrapes_per_second
#
# Options: --workers N, --interval-ms MS, --max-rate SCRAPES_PER_S, --max-concurrent N,
# --body vllm|small, --phase-secs S, --rounds N, --out FILE, --no-pin, --profile P (cargo profile;
# release by default, dev in --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=scrape
# shellcheck source=bench/lib.sh
source bench/lib.sh

WORKERS=64 INTERVAL=100 MAX_RATE=2000 MAX_CONCURRENT=256 BODY=vllm PHASE=10 ROUNDS=3 PIN=1 QUICK=0 OUT="" PROFILE=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --workers) WORKERS=$2; shift ;;
    --interval-ms) INTERVAL=$2; shift ;;
    --max-rate) MAX_RATE=$2; shift ;;
    --max-concurrent) MAX_CONCURRENT=$2; shift ;;
    --body) BODY=$2; shift ;;
    --phase-secs) PHASE=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-pin) PIN=0 ;;
    --profile) PROFILE=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/scrape.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $QUICK == 1 ]] && { PHASE=3; ROUNDS=1; PROFILE=${PROFILE:-dev}; }
PROFILE=${PROFILE:-release}
SIZE=$([[ $WORKERS != 64 ]] && echo "-$WORKERS" || true)
OUT=${OUT:-bench/results/scrape$SIZE$([[ $QUICK == 1 ]] && echo -quick || true).json}

PROXY_RUN=(); LOAD_RUN=()
if [[ $PIN == 1 ]] && [[ $(nproc) -ge 2 ]] && command -v taskset >/dev/null 2>&1; then
  PROXY_RUN=(taskset -c 0); LOAD_RUN=(taskset -c "1-$(($(nproc) - 1))")
fi

log "building gatewayd (profile $PROFILE)"
cargo build --quiet --profile "$PROFILE" -p gatewayd --bin gatewayd
BIN=$(bench_target_dir)/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
bench_workdir

# Two descriptors a worker in the server (listener, connection): one process per 4,000 workers,
# which is over the usual soft limit of 1,024 (the 10,000-worker run failed with EMFILE in accept):
# raise the soft limit to the hard one for every process started here. gatewayd raises its own.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || log "could not raise the fd soft limit to the hard limit"
log "fd limit $(ulimit -n) (hard $(ulimit -Hn))"
: >"$WORK/ports"
for ((left = WORKERS; left > 0; left -= 4000)); do
  "${LOAD_RUN[@]}" python3 bench/metrics_server.py --count $((left < 4000 ? left : 4000)) --body "$BODY" >>"$WORK/ports" &
  PIDS+=($!)
done
for _ in $(seq 1 1200); do [[ $(wc -l <"$WORK/ports") -ge $WORKERS ]] && break; sleep 0.1; done
[[ $(wc -l <"$WORK/ports") -ge $WORKERS ]] || die "the metrics servers did not start"
{
  printf '[server]\nlisten = "127.0.0.1:0"\ncontrol_listen = "127.0.0.1:0"\n\n'
  printf '[load]\nsource = "local"\nscrape_interval_ms = %s\nstale_after_ms = %s\n' "$INTERVAL" $((INTERVAL * 5))
  printf 'max_scrapes_per_second = %s\nmax_concurrent_scrapes = %s\n\n' "$MAX_RATE" "$MAX_CONCURRENT"
  printf '[health]\ninterval_ms = 60000\nwait_for_first_probe = false\n\n'
  printf '[log]\nlevel = "warn"\n'
  i=0
  while read -r port; do
    printf '\n[[workers]]\nname = "w%s"\nurl = "http://127.0.0.1:%s"\n' "$i" "$port"
    i=$((i + 1))
  done <"$WORK/ports"
} >"$WORK/gatewayd.toml"
RUST_LOG=warn "${PROXY_RUN[@]}" "$BIN/gatewayd" --config "$WORK/gatewayd.toml" >"$WORK/gatewayd.log" 2>&1 &
GW=$!; PIDS+=($GW)
for _ in $(seq 1 100); do grep -q "control plane" "$WORK/gatewayd.log" && break; sleep 0.1; done
CONTROL=$(sed -n 's/.*control plane http:\/\/\([^ ]*\).*/\1/p' "$WORK/gatewayd.log" | head -1)
[[ -n $CONTROL ]] || die "gatewayd did not start: $(cat "$WORK/gatewayd.log")"

log "$WORKERS workers ($BODY bodies), scrape every ${INTERVAL} ms at most $MAX_RATE scrapes/s, $MAX_CONCURRENT at once; phases of ${PHASE}s off and on, $ROUNDS round(s)"
mkdir -p "$(dirname "$OUT")"
python3 - "$GW" "$CONTROL" "$PHASE" "$ROUNDS" "$WORKERS" "$INTERVAL" "$BODY" "$OUT" "$MAX_RATE" "$MAX_CONCURRENT" <<'PY'
import json, os, sys, time, urllib.request
pid, control, phase, rounds, workers, interval, body, out, max_rate, max_concurrent = sys.argv[1:]
phase, rounds, workers = float(phase), int(rounds), int(workers)
tick = os.sysconf("SC_CLK_TCK")

def cpu():
    """(user, system) CPU seconds of gatewayd so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) / tick, int(fields[12]) / tick

def put(source):
    req = urllib.request.Request(f"http://{control}/admin/policy", method="PUT",
                                 data=json.dumps({"load_source": source}).encode(),
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req).read()

def scrapes():
    text = urllib.request.urlopen(f"http://{control}/metrics").read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("bch_load_scrapes_total{"))

def all_reported():
    records = json.load(urllib.request.urlopen(f"http://{control}/admin/workers"))["workers"]
    return all(r.get("reported_load") is not None for r in records)

phases = []
for r in range(rounds):
    for source in ["local", "worker_metrics"]:
        put(source)
        # A bound, not a pace: on a loaded machine (debug builds in CI) a round of 64 scrapes can
        # miss some workers for a while; the phase starts as soon as every worker has reported.
        deadline = time.time() + 120
        while source == "worker_metrics" and not all_reported():
            assert time.time() < deadline, "workers not all scraped within 120 s"
            time.sleep(0.5)
        time.sleep(1.0)  # settle: the first round's connections are open
        c0, s0, t0 = cpu(), scrapes(), time.time()
        time.sleep(phase)
        c1, s1, t1 = cpu(), scrapes(), time.time()
        user, system = (100 * (b - a) / (t1 - t0) for a, b in zip(c0, c1))
        phases.append({"round": r + 1, "source": source, "cpu_percent": user + system,
                       "user_percent": user, "system_percent": system,
                       "scrapes_per_s": (s1 - s0) / (t1 - t0)})
        print(f"round {r + 1} {source:<15} cpu {user + system:6.2f} % (user {user:5.2f}, kernel {system:5.2f})"
              f"  scrapes/s {phases[-1]['scrapes_per_s']:7.1f}", file=sys.stderr)
mean = lambda src, key: sum(p[key] for p in phases if p["source"] == src) / rounds
off, on = mean("local", "cpu_percent"), mean("worker_metrics", "cpu_percent")
# The kernel's part (TCP over loopback, wake-ups) is what no change to gatewayd's own code removes.
kernel = mean("worker_metrics", "system_percent") - mean("local", "system_percent")
rate = mean("worker_metrics", "scrapes_per_s")
# CPU per worker per second of scraping: what each worker of the fleet costs the gateway.
per_worker_us = 1e4 * (on - off) / workers
result = {"workers": workers, "interval_ms": int(interval), "body": body, "phase_s": phase, "rounds": rounds,
          "max_scrapes_per_second": int(max_rate), "max_concurrent_scrapes": int(max_concurrent),
          "cpu_us_per_worker_per_s": per_worker_us,
          "cpu_percent_off": off, "cpu_percent_on": on, "cost_percent_of_one_core": on - off,
          "kernel_percent_of_one_core": kernel,
          "us_per_scrape": 1e4 * (on - off) / rate if rate else None,
          "scrapes_per_s": rate, "phases": phases}
json.dump(result, open(out, "w"), indent=2)
print(f"scraping {workers} workers every {interval} ms costs {on - off:.2f} % of one core, "
      f"{kernel:.2f} of it in the kernel ({off:.2f} % off, {on:.2f} % on; {rate:.0f} scrapes/s, "
      f"{result['us_per_scrape'] or 0:.0f} us each; {per_worker_us:.1f} us of CPU per worker per second)")
PY
log "results written to $OUT"
