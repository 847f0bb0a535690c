# Shared by the suites under tests/ that run real peers installed from package registries (envoy,
# kubernetes, real): their progress and error lines, the one-line result a failed start still owes
# `.ci/run`, and a Python virtualenv with pinned packages. Sourced, not run.

# suite_begin NAME: names the suite in every line and starts its clock.
suite_begin() {
  SUITE=$1
  START=$(date +%s)
}

# A progress line: `[NAME   12s] message`.
log() { printf '[%s %4ss] %s\n' "$SUITE" "$(($(date +%s) - START))" "$*"; }

# Stops the suite before its checks ran, with the result line `.ci/run` reads.
die() {
  log "error: $*"
  echo "$SUITE: 0 passed, 1 failed"
  exit 1
}

# suite_venv VENV LOG_DIR KEEP PACKAGES...: a virtualenv at VENV with PACKAGES (pinned `name==x.y`)
# installed. KEEP=0 recreates it. Where `python3 -m venv` fails for want of Debian's python3-venv,
# installs that as root. pip runs only when the pins differ from what the virtualenv last installed,
# so a rerun costs nothing; its log is LOG_DIR/pip.log.
suite_venv() {
  local venv=$1 logs=$2 keep=$3
  shift 3
  local packages="$*"
  if [ "$keep" = 0 ]; then rm -rf "$venv"; fi
  if [ ! -x "$venv/bin/python" ] && ! python3 -m venv "$venv" >"$logs/venv.log" 2>&1; then
    rm -rf "$venv"
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || die "python3 -m venv failed (log: $logs/venv.log)"
    log "apt-get install python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv" || die "python3 -m venv failed"
  fi
  local stamp="$venv/.bch-installed"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$packages" ]; then
    log "pip install $packages"
    if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q "$@" >"$logs/pip.log" 2>&1; then
      tail -n 20 "$logs/pip.log"
      die "pip install failed (log: $logs/pip.log)"
    fi
    echo "$packages" >"$stamp"
  fi
}
