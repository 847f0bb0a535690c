#!/usr/bin/env bash
# gatewayd with a 10,000-worker fleet that need not be live, every figure of the scale goals in one
# run, each as a ratio against its small case: start-up time at 16 and 10,000 static workers; one
# admin add / remove at 10,000 against an admin call that changes nothing; all /ws bytes up to the
# first tick at 16, 1,000 and 10,000 (protocol versions 2 and 1); one decision at 16 and 10,000
# (cargo bench -p bch-core) and the console's draw time (cargo bench -p bch-tui), both criterion
# runs of 1 s warm-up and 3 s measurement; then the goals, met or not. Probes are slowed to one
# round an hour and fail at once (nothing listens on the workers' addresses), new workers start
# healthy, scraping is off. The `probes` step measures the prober itself: 10,000 workers probed
# at the default 2 s interval, the gateway's CPU over the first interval and after, and the most
# sockets it held. See docs/benchmarks.md ("Scale").
#
#   bash bench/scale.sh                      # every step, 10,000 workers (minutes after the build)
#   bash bench/scale.sh --steps startup      # named steps only (startup, admin, ws, decision, draw, probes, goals)
#
# Options: --workers N, --repeats N (start-ups per size), --calls N (admin rounds), --steps LIST,
# --out FILE, --profile P (cargo profile; release by default). Steps live in bench/scale.py as
# `step_<name>` functions: a new measurement is one more function there.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_NAME=scale
# shellcheck source=bench/lib.sh
source bench/lib.sh

WORKERS=10000 REPEATS=3 CALLS=20 STEPS="" OUT="bench/results/scale.json" PROFILE=release
while [[ $# -gt 0 ]]; do
  case $1 in
    --workers) WORKERS=$2; shift ;;
    --repeats) REPEATS=$2; shift ;;
    --calls) CALLS=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --profile) PROFILE=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/scale.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

# One worker is one socket at most (a probe); the fleet needs more descriptors than the usual soft
# limit of 1,024. Raise the soft limit to the hard one (gatewayd also does so itself at start, but
# this script's own sockets and any tool it runs need it too), and say what it is.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || log "could not raise the fd soft limit to the hard limit"
log "fd limit $(ulimit -n) (hard $(ulimit -Hn))"
log "building gatewayd ($PROFILE)"
cargo build --quiet --profile "$PROFILE" -p gatewayd
DIR=$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
BINARY="$(bench_target_dir)/$DIR/gatewayd"
mkdir -p "$(dirname "$OUT")"
python3 bench/scale.py --binary "$BINARY" --workers "$WORKERS" --repeats "$REPEATS" \
  --calls "$CALLS" ${STEPS:+--steps "$STEPS"} --out "$OUT"
log "results in $OUT"
