#!/usr/bin/env bash
# End-to-end test of the operator console in a real terminal:
#
#   bash tests/e2e/tui_tmux.sh
#
# Builds gatewayd and bch-tui (debug), starts `gatewayd --demo` on free loopback ports, runs bch-tui
# in a detached 120x40 tmux session on a private tmux server, and checks the screen by polling
# `tmux capture-pane` against deadlines: CONNECTED, the four simulated workers, moving load, `G`
# raising min_load_gap (confirmed by GET /admin/policy and on screen), `d` draining and `u`
# undraining the selected worker (confirmed by GET /admin/workers and on screen), RECONNECTING when gatewayd
# stops, CONNECTED again when it restarts on the same ports, and `q` ending the console with exit
# status 0. The console records the whole run (--record); the recording is then replayed
# (--replay) in the same tmux session: REPLAY in the header, the same four workers, the spills of
# the demo's hot keys at the end, the threshold keys refused, and --replay --snapshot printing
# one screen. Stops only what it started (by pid, and its own tmux server). Every captured pane is kept
# in a temporary directory whose path is printed; the last line is `tui e2e: N passed, M failed`.
#
# Environment: BCH_E2E_KEEP_GOING=0 stops at the first failed check (default: run them all).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

START=$(date +%s)
log() { printf '[tui-e2e %3ss] %s\n' "$(($(date +%s) - START))" "$*"; }

PASSED=0
FAILED=0
pass() {
  PASSED=$((PASSED + 1))
  log "PASS $*"
}
fail() {
  FAILED=$((FAILED + 1))
  log "FAIL $*"
  if [ "${BCH_E2E_KEEP_GOING:-1}" = 0 ]; then finish; fi
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bch-tui-e2e.XXXXXX")
SESSION="bch-e2e-$$"
GW_PID=""
SHOT=0

# ---------------------------------------------------------------- cleanup
stop_gatewayd() {
  # Graceful stop (SIGTERM), bounded; SIGKILL if it does not exit in time.
  local pid=$GW_PID deadline
  [ -n "$pid" ] || return 0
  GW_PID=""
  kill -TERM "$pid" 2>/dev/null || return 0
  deadline=$(($(date +%s) + 15))
  while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "gatewayd (pid $pid) did not stop within 15 s of SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null
  return 0
}
tmx() { tmux -S "$WORK/tmux.sock" "$@"; }
cleanup() {
  stop_gatewayd
  tmx kill-server >/dev/null 2>&1 || true
  rm -f "$WORK/tmux.sock"
}
finish() {
  trap - EXIT INT TERM
  cleanup
  log "gatewayd log and captured panes: $WORK"
  echo "tui e2e: $PASSED passed, $FAILED failed"
  [ "$FAILED" = 0 ] && [ "$PASSED" -gt 0 ]
  exit $?
}
trap finish EXIT
trap 'log "interrupted"; FAILED=$((FAILED + 1)); finish' INT TERM

abort() {
  log "error: $*"
  FAILED=$((FAILED + 1))
  finish
}

# ---------------------------------------------------------------- prerequisites
# A fresh Debian CI machine may lack any of them: install what is missing (root and apt-get).
missing=()
for tool in tmux curl python3; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  (DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >"$WORK/apt.log" 2>&1 ||
    abort "${missing[*]} missing and could not be installed (need root and apt-get; see $WORK/apt.log)"
fi

log "cargo build -p gatewayd -p bch-tui"
cargo build -p gatewayd -p bch-tui || abort "build failed"
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
GATEWAYD="$TARGET_DIR/debug/gatewayd"
BCH_TUI="$TARGET_DIR/debug/bch-tui"
[ -x "$GATEWAYD" ] && [ -x "$BCH_TUI" ] || abort "built binaries not found in $TARGET_DIR/debug"
BUILT=$(date +%s)

# ---------------------------------------------------------------- helpers
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
DATA_PORT=$(free_port)
CONTROL_PORT=$(free_port)
while [ "$CONTROL_PORT" = "$DATA_PORT" ]; do CONTROL_PORT=$(free_port); done
CONTROL="http://127.0.0.1:$CONTROL_PORT"
WS_URL="ws://127.0.0.1:$CONTROL_PORT/ws"

start_gatewayd() {
  echo "---- start $(date -u +%H:%M:%S)" >>"$WORK/gatewayd.log"
  "$GATEWAYD" --demo --listen "127.0.0.1:$DATA_PORT" --control-listen "127.0.0.1:$CONTROL_PORT" \
    >>"$WORK/gatewayd.log" 2>&1 &
  GW_PID=$!
  local deadline=$(($(date +%s) + 30))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if ! kill -0 "$GW_PID" 2>/dev/null; then
      wait "$GW_PID"
      log "gatewayd exited with status $? (log: $WORK/gatewayd.log)"
      GW_PID=""
      tail -n 20 "$WORK/gatewayd.log" >&2
      return 1
    fi
    if curl -sf --max-time 1 "$CONTROL/admin/workers" >/dev/null 2>&1; then
      # The demo falls back to free ports when its ports are busy; the console would never find it.
      if grep -q "ports busy" "$WORK/gatewayd.log"; then
        log "gatewayd did not get ports $DATA_PORT/$CONTROL_PORT"
        return 1
      fi
      return 0
    fi
    sleep 0.1
  done
  log "gatewayd did not answer GET /admin/workers within 30 s (log: $WORK/gatewayd.log)"
  return 1
}

# Captures the pane into the next numbered file in $WORK and into $PANE.
PANE=""
capture() {
  SHOT=$((SHOT + 1))
  PANE=$(tmx capture-pane -p -t "$SESSION" 2>/dev/null) || PANE=""
  printf '%s\n' "$PANE" >"$WORK/$(printf '%03d' "$SHOT")-$1.txt"
}
# wait_screen NAME SECONDS PREDICATE...: polls the pane until PREDICATE (run with the pane on
# stdin) succeeds; keeps the matching capture as NAME.txt.
wait_screen() {
  local name=$1 seconds=$2
  shift 2
  local deadline=$(($(date +%s) + seconds))
  while :; do
    capture "$name"
    if printf '%s\n' "$PANE" | "$@" >/dev/null 2>&1; then
      printf '%s\n' "$PANE" >"$WORK/$name.txt"
      return 0
    fi
    [ "$(date +%s)" -lt "$deadline" ] || break
    sleep 0.2
  done
  printf '%s\n' "$PANE" >"$WORK/$name.FAILED.txt"
  return 1
}
header() { head -n 1; }
connected() { head -n 1 | grep -q '● CONNECTED'; }
reconnecting() { head -n 1 | grep -q 'RECONNECTING'; }
policy_gap() {
  curl -sf --max-time 2 "$CONTROL/admin/policy" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["min_load_gap"])'
}
# The worker rows of the Workers panel (bars and in-flight counts). Alternation rather than a
# bracket expression: in the C locale (CI) grep reads `[●✗]` as a set of single bytes.
# The selected row has `▸` between the glyph and the name.
worker_rows() { grep -E '^║(●|✗)( |▸)sim-[0-9]'; }
worker_state() {
  curl -sf --max-time 2 "$CONTROL/admin/workers" |
    python3 -c 'import json,sys; print({w["name"]: w["state"] for w in json.load(sys.stdin)["workers"]}[sys.argv[1]])' "$1"
}

# ---------------------------------------------------------------- the run
log "gatewayd --demo on 127.0.0.1:$DATA_PORT (data) and 127.0.0.1:$CONTROL_PORT (control)"
start_gatewayd || abort "gatewayd did not start"

# A private tmux server (-S, its socket in $WORK) with no user configuration; remain-on-exit keeps
# the pane (and its last screen) after bch-tui exits.
printf 'set -g remain-on-exit on\nset -g history-limit 0\n' >"$WORK/tmux.conf"
env -u BCH_TOKEN_FILE -u BCH_TUI_URL -u TMUX \
  tmux -S "$WORK/tmux.sock" -f "$WORK/tmux.conf" new-session -d -s "$SESSION" -x 120 -y 40 \
  "'$BCH_TUI' --url '$WS_URL' --record '$WORK/demo.jsonl'; echo \$? >'$WORK/bch-tui.exit'" || abort "cannot start tmux"
log "bch-tui --url $WS_URL in tmux session $SESSION (socket $WORK/tmux.sock)"

# 1. Connected.
if wait_screen connected 20 connected; then
  pass "header shows CONNECTED: $(header <"$WORK/connected.txt" | sed 's/  */ /g')"
else
  fail "header never showed ● CONNECTED: $(header <"$WORK/connected.FAILED.txt")"
fi

# 2. The four simulated workers.
has_workers() {
  local pane
  pane=$(cat)
  for w in sim-0 sim-1 sim-2 sim-3; do
    printf '%s\n' "$pane" | worker_rows | grep -q "$w " || return 1
  done
}
if wait_screen workers 15 has_workers; then
  pass "workers panel lists sim-0 sim-1 sim-2 sim-3"
else
  fail "workers panel does not list sim-0..sim-3"
fi

# 3. Load moves: the worker rows change between captures and the header's req/s is non-zero in
# at least one of them (it is the rate over the last 100 ms telemetry interval, so it flickers).
FIRST_ROWS=$(worker_rows <"$WORK/workers.txt")
rows_changed() { [ "$(worker_rows)" != "$FIRST_ROWS" ]; }
req_nonzero() { head -n 2 | grep -Eq 'req/s [0-9]*[1-9][0-9]*\.[0-9]|req/s [0-9]+\.[1-9]'; }
moved=0
rate=0
deadline=$(($(date +%s) + 20))
while [ "$(date +%s)" -lt "$deadline" ]; do
  capture load
  if [ $moved = 0 ] && printf '%s\n' "$PANE" | rows_changed; then
    moved=1
    printf '%s\n' "$PANE" >"$WORK/load-moved.txt"
  fi
  if [ $rate = 0 ] && printf '%s\n' "$PANE" | req_nonzero; then
    rate=1
    printf '%s\n' "$PANE" >"$WORK/load-rate.txt"
  fi
  [ $moved = 1 ] && [ $rate = 1 ] && break
  sleep 0.2
done
if [ $moved = 1 ] && [ $rate = 1 ]; then
  pass "load moves (worker rows changed; $(head -n 2 "$WORK/load-rate.txt" | tail -n 1 | grep -o 'req/s [0-9.]*'))"
else
  fail "load does not move (worker rows changed: $moved, non-zero req/s seen: $rate)"
fi

# 4. G raises min_load_gap by one: the gateway's policy and the screen agree.
OLD_GAP=$(policy_gap) || OLD_GAP=""
if [ -z "$OLD_GAP" ]; then
  fail "GET /admin/policy did not answer"
else
  NEW_GAP=$((OLD_GAP + 1))
  tmx send-keys -t "$SESSION" G
  got=""
  deadline=$(($(date +%s) + 10))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    got=$(policy_gap) || got=""
    [ "$got" = "$NEW_GAP" ] && break
    sleep 0.1
  done
  shows_new_gap() {
    local pane
    pane=$(cat)
    printf '%s\n' "$pane" | sed -n 2p | grep -q "gap $NEW_GAP " &&
      printf '%s\n' "$pane" | head -n 4 | grep -q "gap $OLD_GAP → $NEW_GAP ✓ applied"
  }
  if [ "$got" != "$NEW_GAP" ]; then
    fail "after G, GET /admin/policy says min_load_gap $got, expected $NEW_GAP"
  elif wait_screen gap-raised 10 shows_new_gap; then
    pass "G: GET /admin/policy min_load_gap $OLD_GAP → $NEW_GAP and the screen shows gap $NEW_GAP, applied"
  else
    fail "G: the policy changed to $NEW_GAP but the screen does not show it"
  fi
fi

# 4b. d drains the selected worker (the first row, sim-0, with the Workers panel focused) and u
# undrains it: the gateway's /admin/workers and the screen agree.
wait_state() {
  local want=$1 got="" deadline=$(($(date +%s) + 10))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    got=$(worker_state sim-0) || got=""
    [ "$got" = "$want" ] && return 0
    sleep 0.1
  done
  log "sim-0 state: '$got', expected '$want'"
  return 1
}
sim0_drains() { worker_rows | grep 'sim-0 ' | grep -q DRAIN; }
sim0_active() { ! worker_rows | grep 'sim-0 ' | grep -q DRAIN; }
tmx send-keys -t "$SESSION" d
if ! wait_state draining; then
  fail "d: GET /admin/workers does not show sim-0 draining"
elif wait_screen drained 10 sim0_drains; then
  pass "d: sim-0 draining on the gateway and DRAIN on screen"
else
  fail "d: sim-0 is draining but the screen does not show DRAIN"
fi
tmx send-keys -t "$SESSION" u
if ! wait_state active; then
  fail "u: GET /admin/workers does not show sim-0 active again"
elif wait_screen undrained 10 sim0_active; then
  pass "u: sim-0 active again on the gateway and on screen"
else
  fail "u: sim-0 is active but the screen still shows DRAIN"
fi

# 5. gatewayd stops: RECONNECTING.
stop_gatewayd
if wait_screen reconnecting 15 reconnecting; then
  pass "gatewayd stopped: $(header <"$WORK/reconnecting.txt" | sed 's/  */ /g')"
else
  fail "gatewayd stopped but the header never showed RECONNECTING"
fi

# 6. gatewayd restarts on the same ports: CONNECTED again (backoff is at most 5 s), showing the new
# process's policy (its default gap, not the one G set on the old process).
fresh_gateway() {
  local pane
  pane=$(cat)
  printf '%s\n' "$pane" | connected &&
    { [ -z "$OLD_GAP" ] || printf '%s\n' "$pane" | sed -n 2p | grep -q "gap $OLD_GAP "; }
}
if ! start_gatewayd; then
  fail "gatewayd did not restart on the same ports"
elif wait_screen reconnected 20 fresh_gateway; then
  pass "gatewayd restarted: $(header <"$WORK/reconnected.txt" | sed 's/  */ /g'), gap back to ${OLD_GAP:-?}"
else
  fail "gatewayd restarted but the header never showed ● CONNECTED again"
fi

# 7. q quits: bch-tui exits with status 0. The pane's shell writes the status to a file: tmux's own
# #{pane_dead_status} is sometimes never filled in (tmux 3.3a left the exited process a zombie).
tmx send-keys -t "$SESSION" q
status=""
deadline=$(($(date +%s) + 10))
while [ "$(date +%s)" -lt "$deadline" ]; do
  status=$(cat "$WORK/bch-tui.exit" 2>/dev/null) || status=""
  [ -n "$status" ] && break
  sleep 0.1
done
capture quit
if [ "$status" = 0 ]; then
  pass "q: bch-tui exited with status 0"
else
  fail "q: bch-tui did not exit cleanly within 10 s (exit status: '${status:-still running}')"
fi

# 8. The recording: the four workers and the demo's spills, as the live console received them.
RECORDED=$(python3 - "$WORK/demo.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
header = json.loads(lines[0])
assert header["format"] == "bch-recording" and header["recorder"] == "bch-tui", header
workers, spilled = set(), set()
for line in lines[1:]:
    event = json.loads(line)
    frame = event.get("frame") or {}
    for worker in frame.get("workers", []):
        workers.add(worker["name"])
    for spill in frame.get("spills", []):
        spilled.add(spill["key"])
print(" ".join(sorted(workers)), "|", " ".join(sorted(spilled)))
PY
) || RECORDED=""
RECORDED_WORKERS=${RECORDED%% |*}
RECORDED_SPILLS=${RECORDED##*| }
if [ "$RECORDED_WORKERS" = "sim-0 sim-1 sim-2 sim-3" ] && [ -n "$RECORDED_SPILLS" ]; then
  pass "--record: the recording holds sim-0..sim-3 and spills of $RECORDED_SPILLS"
else
  fail "--record: the recording holds workers '$RECORDED_WORKERS' and spilled keys '$RECORDED_SPILLS'"
fi

# 9. The replay, in a new window of the same session: REPLAY, the same workers; at its first
# spill (]) the spills panel shows the demo's spilled keys; G is refused and changes nothing.
tmx new-window -t "$SESSION" \
  "'$BCH_TUI' --replay '$WORK/demo.jsonl'; echo \$? >'$WORK/replay.exit'" ||
  fail "cannot open the replay's window"
replaying() { head -n 1 | grep -q 'REPLAY'; }
if wait_screen replay 15 replaying && wait_screen replay-workers 15 has_workers; then
  pass "--replay: $(header <"$WORK/replay.txt" | sed 's/  */ /g'), sim-0..sim-3 listed"
else
  fail "--replay: no REPLAY header with sim-0..sim-3"
fi
tmx send-keys -t "$SESSION" ']'
spills_shown() {
  local pane key
  pane=$(cat)
  printf '%s\n' "$pane" | grep -Eq 'Spills [1-9][0-9]* total' || return 1
  for key in $RECORDED_SPILLS; do
    printf '%s\n' "$pane" | grep -q "$key" && return 0
  done
  return 1
}
if wait_screen replay-end 10 spills_shown; then
  pass "--replay ]: the spills panel shows $(grep -Eo 'Spills [0-9]+ total' "$WORK/replay-end.txt" | head -n 1) with the recorded keys"
else
  fail "--replay ]: the spills panel does not show the recorded spills"
fi
GAP_BEFORE=$(policy_gap) || GAP_BEFORE=""
tmx send-keys -t "$SESSION" G
refused() { grep -q 'do nothing'; }
if wait_screen replay-refused 10 refused && [ "$(policy_gap)" = "$GAP_BEFORE" ]; then
  pass "--replay G: refused on screen, min_load_gap still $GAP_BEFORE"
else
  fail "--replay G: not refused, or the gateway's min_load_gap changed"
fi
tmx send-keys -t "$SESSION" q
status=""
deadline=$(($(date +%s) + 10))
while [ "$(date +%s)" -lt "$deadline" ]; do
  status=$(cat "$WORK/replay.exit" 2>/dev/null) || status=""
  [ -n "$status" ] && break
  sleep 0.1
done
if [ "$status" = 0 ]; then
  pass "--replay q: exited with status 0"
else
  fail "--replay q: did not exit cleanly (exit status: '${status:-still running}')"
fi

# 10. --replay --snapshot: one 80x24 screen as text, without a terminal.
"$BCH_TUI" --replay "$WORK/demo.jsonl" --snapshot 5 --width 80 --height 24 \
  >"$WORK/replay-snapshot.txt" 2>"$WORK/replay-snapshot.err"
if [ $? = 0 ] && [ "$(wc -l <"$WORK/replay-snapshot.txt")" = 24 ] &&
  head -n 1 "$WORK/replay-snapshot.txt" | grep -q REPLAY &&
  worker_rows <"$WORK/replay-snapshot.txt" | grep -q 'sim-0 '; then
  pass "--replay --snapshot 5: 24 rows, REPLAY, sim-0 listed"
else
  fail "--replay --snapshot 5: see $WORK/replay-snapshot.txt and .err"
fi

log "checks took $(($(date +%s) - BUILT)) s after the build"
finish
