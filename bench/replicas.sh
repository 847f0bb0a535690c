#!/usr/bin/env bash
# Fleet-wide load through several replicas: a hot-key storm (bch-drill ab) through three gatewayd
# replicas over four simulated workers, requests round-robin over the replicas as an L4 balancer
# spreads them, with the load the rule reads set to `local` and to `worker_metrics`; and the same
# storm through one replica alone, the reference. Reports each cell's hottest worker share, spill
# fraction and TTFT, and how far three replicas land from one. See docs/benchmarks.md.
#
#   bash bench/replicas.sh            # 5 repetitions of each cell (~4 min after the build)
#   bash bench/replicas.sh --quick    # 1 repetition, short storms (smoke)
#
# Options: --reps N, --groups N, --keys N, --time-scale X, --replicas N, --out FILE,
# --profile P (cargo profile; release by default, dev in --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=replicas
# shellcheck source=bench/lib.sh
source bench/lib.sh

REPS=5 NGROUPS=60 KEYS=2 SCALE=0.2 REPLICAS=3 QUICK=0 OUT="" PROFILE=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --reps) REPS=$2; shift ;;
    --groups) NGROUPS=$2; shift ;;
    --keys) KEYS=$2; shift ;;
    --time-scale) SCALE=$2; shift ;;
    --replicas) REPLICAS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --profile) PROFILE=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/replicas.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $QUICK == 1 ]] && { REPS=1; NGROUPS=12; PROFILE=${PROFILE:-dev}; }
PROFILE=${PROFILE:-release}
OUT=${OUT:-bench/results/replicas$([[ $QUICK == 1 ]] && echo -quick || true).json}
[[ $REPLICAS -ge 2 ]] || die "--replicas must be at least 2 (one replica is the reference)"

log "building gatewayd and bch-drill (profile $PROFILE)"
cargo build --quiet --profile "$PROFILE" -p gatewayd -p bch-drill --bins
BIN=$(bench_target_dir)/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
bench_workdir

"$BIN/bch-drill" workers --count 4 --base-port 0 --time-scale "$SCALE" >"$WORK/workers" 2>"$WORK/workers.log" &
PIDS+=($!)
for _ in $(seq 1 100); do [[ $(wc -l <"$WORK/workers") -ge 4 ]] && break; sleep 0.1; done
[[ $(wc -l <"$WORK/workers") -ge 4 ]] || die "the simulated workers did not start: $(cat "$WORK/workers.log")"

# Every replica runs the same configuration; the A/B cells switch the load source on all of them.
{
  printf '[server]\nlisten = "127.0.0.1:0"\ncontrol_listen = "127.0.0.1:0"\n\n'
  printf '[policy]\nkind = "bounded_consistent_hashing"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\n'
  printf '[load]\nsource = "local"\nscrape_interval_ms = 100\nstale_after_ms = 500\n\n'
  printf '[log]\nlevel = "warn"\n'
  while read -r name url; do
    printf '\n[[workers]]\nname = "%s"\nurl = "%s"\n' "$name" "$url"
  done <"$WORK/workers"
} >"$WORK/gatewayd.toml"

DATA=() CONTROL=()
for i in $(seq 1 "$REPLICAS"); do
  RUST_LOG=warn "$BIN/gatewayd" --config "$WORK/gatewayd.toml" >"$WORK/gatewayd-$i.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do grep -q "control plane" "$WORK/gatewayd-$i.log" && break; sleep 0.1; done
  line=$(grep -m1 "control plane" "$WORK/gatewayd-$i.log") || die "replica $i did not start: $(cat "$WORK/gatewayd-$i.log")"
  DATA+=("$(sed -n 's/.*data plane \(http:\/\/[^ ]*\).*/\1/p' <<<"$line")")
  CONTROL+=("$(sed -n 's/.*control plane \(http:\/\/[^ ]*\).*/\1/p' <<<"$line")")
  wait_probed "${CONTROL[-1]}" 4
done
join() { local IFS=,; echo "$*"; }

STORM=(--groups "$NGROUPS" --siblings 8 --keys "$KEYS" --concurrency 4 --prefix-tokens 512 --max-tokens 32)
CELLS=gap=2:load=local,gap=2:load=worker_metrics
log "one replica: $CELLS, $REPS repetition(s) of $NGROUPS groups x 8 siblings over $KEYS keys"
"$BIN/bch-drill" ab --gateway "${DATA[0]}" --control "${CONTROL[0]}" --cells "$CELLS" --reps "$REPS" \
  "${STORM[@]}" --out "$WORK/one.json" >"$WORK/one.txt"
log "$REPLICAS replicas, requests round-robin: the same cells"
"$BIN/bch-drill" ab --gateway "$(join "${DATA[@]}")" --control "$(join "${CONTROL[@]}")" --cells "$CELLS" \
  --reps "$REPS" "${STORM[@]}" --out "$WORK/many.json" >"$WORK/many.txt"

mkdir -p "$(dirname "$OUT")"
python3 - "$WORK/one.json" "$WORK/many.json" "$OUT" "$REPLICAS" <<'PY'
import json, sys
one, many, out, replicas = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], int(sys.argv[4])
def cells(report):
    return {c["policy"].get("load_source", "local"): c for c in report["cells"]}
ref, fleet = cells(one), cells(many)
rows, result = [], {"replicas": replicas, "reps": one["reps"], "cells": {}}
print(f"{'setup':<26} {'hottest':>8} {'spill':>7} {'TTFT mean':>10} {'TTFT p99':>10} {'req/s':>7}  drained")
for label, cell in [("1 replica, local", ref["local"]), ("1 replica, worker_metrics", ref["worker_metrics"]),
                    (f"{replicas} replicas, local", fleet["local"]),
                    (f"{replicas} replicas, worker_metrics", fleet["worker_metrics"])]:
    print(f"{label:<26} {cell['hottest_worker_share']:>7.1%} {cell['spill_fraction']:>7.1%} "
          f"{cell['ttft_mean_ms']:>8.1f}ms {cell['ttft_p99_ms']:>8.1f}ms {cell['throughput_rps']:>7.1f}  {cell['drained']}")
    result["cells"][label] = {k: cell[k] for k in ["hottest_worker_share", "spill_fraction", "ttft_mean_ms",
                                                   "ttft_p99_ms", "throughput_rps", "errors", "drained", "runs"]}
for source in ["local", "worker_metrics"]:
    d_hot = 100 * (fleet[source]["hottest_worker_share"] - ref["local"]["hottest_worker_share"])
    d_spill = 100 * (fleet[source]["spill_fraction"] - ref["local"]["spill_fraction"])
    result[f"{source}_vs_one_replica_pp"] = {"hottest_worker_share": d_hot, "spill_fraction": d_spill}
    print(f"{replicas} replicas, {source}: hottest {d_hot:+.1f} pp, spill {d_spill:+.1f} pp vs one replica")
ok = all(abs(v) <= 5 for v in result["worker_metrics_vs_one_replica_pp"].values())
result["worker_metrics_within_5pp"] = ok
print(f"worker_metrics within 5 percentage points of one replica: {'yes' if ok else 'no'}")
json.dump({"summary": result, "one_replica": one, "replicas_run": many}, open(out, "w"), indent=2)
PY
log "results written to $OUT"
