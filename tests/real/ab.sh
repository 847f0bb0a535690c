#!/usr/bin/env bash
# The bounded-policy A/B on real workers: `bch-drill ab` through gatewayd against the two llama.cpp
# servers of tests/real/run.sh (llama-cpp-python, SmolLM2-135M, one thread each), cells strict and
# gap=2, groups of 8 siblings sharing a fresh 150-token prefix per group (the original A/B's shape).
#
#   bash tests/real/ab.sh            # the measurement: about ten minutes on a 2-core machine
#   bash tests/real/ab.sh --quick    # CI: one group per cell, one repetition; checks the pipeline only
#
# Writes tests/real/.work/ab.json (the AbReport: seeds, times, policy, every run), ab.svg and ab.txt
# (the printed tables), then checks the report: every request answered, the gateway's policy restored,
# the bounded cell spilled and strict did not. Ends with `real-ab: N passed, M failed`.
#
# Environment: BCH_REAL_PROFILE=release builds gatewayd and bch-drill in release mode (default:
# debug, what `cargo test` built); BCH_AB_GROUPS and BCH_AB_REPS override the size; BCH_REAL_PIN
# (none, split, shared) pins the workers to CPUs (tests/real/fleet.sh); BCH_AB_CELLS replaces the
# cells (the first must be strict, e.g. strict,gap=2,gap=0:skew=1); extra arguments after --quick
# or none are passed to `bch-drill ab` (e.g. --seed 7).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/real/fleet.sh
. "$HERE/fleet.sh"

N_GROUPS_DEFAULT=12
REPS_DEFAULT=5
if [ "${1:-}" = --quick ]; then
  shift
  N_GROUPS_DEFAULT=1
  REPS_DEFAULT=1
fi
N_GROUPS=${BCH_AB_GROUPS:-$N_GROUPS_DEFAULT}
REPS=${BCH_AB_REPS:-$REPS_DEFAULT}
CELLS=${BCH_AB_CELLS:-strict,gap=2}
case "$CELLS" in strict,*) ;; *) echo "BCH_AB_CELLS must start with strict, got $CELLS" >&2; exit 2 ;; esac

fleet_prepare
fleet_build_gatewayd
log "cargo build -p bch-drill ($PROFILE)"
if [ "$PROFILE" = release ]; then
  (cd "$ROOT" && cargo build -q --locked --release -p bch-drill)
else
  (cd "$ROOT" && cargo build -q --locked -p bch-drill)
fi
DRILL="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE/bch-drill"
[ -x "$DRILL" ] || die "no bch-drill binary at $DRILL"

fleet_pick_ports
fleet_start_workers
# Strict to begin with: the A/B restores the policy it finds.
fleet_start_gatewayd --policy consistent_hashing

log "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
log "bch-drill ab: $N_GROUPS groups x 8 siblings, $REPS repetitions, cells $CELLS${BCH_REAL_PIN:+, pin $BCH_REAL_PIN}"
set +e
"$DRILL" ab --gateway "http://127.0.0.1:$GW" --control "http://127.0.0.1:$CTL" \
  --cells "$CELLS" --reps "$REPS" --groups "$N_GROUPS" --siblings 8 --concurrency 1 \
  --prefix-scope group --prefix-tokens 150 --suffix-tokens 8 --max-tokens 8 \
  --out "$WORK/ab.json" --plot "$WORK/ab.svg" "$@" >"$WORK/ab.txt" 2>"$WORK/ab.log"
rc=$?
set -e
cat "$WORK/ab.log" "$WORK/ab.txt"
log "machine after: load average $(cut -d' ' -f1-3 /proc/loadavg)"
POLICY_AFTER=$(curl -fsS --max-time 5 "http://127.0.0.1:$CTL/admin/policy" || echo '{}')
cleanup
log "done in $(($(date +%s) - START)) s"
[ "$rc" = 0 ] || die "bch-drill ab failed with status $rc (log $WORK/ab.log)"

"$PY" - "$WORK/ab.json" "$POLICY_AFTER" <<'EOF'
import json, sys

report = json.load(open(sys.argv[1]))
after = json.loads(sys.argv[2])
passed = failed = 0


def check(ok, what):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + what)
    if ok:
        passed += 1
    else:
        failed += 1


runs = report["runs"]
check(all(r["report"]["errors"] == 0 and r["report"]["ok"] == r["report"]["requests"] for r in runs),
      f"every request of {len(runs)} runs answered")
check(report["meta"]["policy_restored"] and after.get("kind") == "consistent_hashing",
      f"the gateway's policy was restored ({after.get('kind')})")
cells = {c["label"]: c for c in report["cells"]}
check(cells["strict"]["spill_fraction"] == 0.0, "strict never spilled")
for label, cell in cells.items():
    if label != "strict":
        check(cell["spill_fraction"] > 0.0, f"{label} spilled {cell['spill_fraction']:.1%} of the siblings")
check(all(w["sim"] is None for w in report["meta"]["workers"]),
      "the workers are real servers (no simulator settings)")
check(not any(c["cached_reported"] for c in report["cells"]),
      "llama-cpp-python reports no cached tokens, and the report says n/a rather than 0")
print(f"real-ab: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
