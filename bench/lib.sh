# Shared plumbing of the bench/ scripts; sourced after `cd` to the repository root, with
# BENCH_NAME set (the prefix of log lines and the name in errors).
#
#   log MSG / die MSG           timestamped progress on stderr / error and exit 1
#   bench_target_dir            cargo's target directory (honours CARGO_TARGET_DIR and config)
#   bench_workdir               makes $WORK (removed on exit) and kills every pid in PIDS on exit
#   port_free PORT              true when nothing listens on 127.0.0.1:PORT
#   wait_port PORT [SECONDS]    waits (default 10 s) until something listens on 127.0.0.1:PORT

log() { printf '[%s %(%H:%M:%S)T] %s\n' "$BENCH_NAME" -1 "$*" >&2; }
die() { echo "bench/$(basename "$0"): error: $*" >&2; exit 1; }

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
