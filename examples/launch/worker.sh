#!/usr/bin/env bash
# Multi-node GRPO, every node but the head: join the head's Ray cluster (retrying until the head
# answers, up to JOIN_TIMEOUT s), stay up while the head is there, and on exit stop exactly the
# processes started here. The head runs examples/launch/master.sh.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: MASTER_ADDR=HEAD_IP bash examples/launch/worker.sh [--temp-dir DIR]

Joins the Ray cluster at MASTER_ADDR:MASTER_PORT with this node's devices and lives as long
as the node: it leaves (exit 0) when the head has been unreachable for HEAD_LOST_TIMEOUT s,
and stops its own Ray processes, and only those, on exit, Ctrl-C or SIGTERM.

environment (defaults in brackets):
  MASTER_ADDR         the head node's IP (required)
  MASTER_PORT         the head's Ray (GCS) port [6344]
  NODE_IP_ADDRESS     this node's IP as the others reach it [Ray's choice: the route to the head]
  DEVICE_TYPE         npu | gpu | cpu [detected: npu-smi/torch_npu, nvidia-smi, else cpu]
  NUM_DEVICES         devices of this node [detected; on cpu: the CPU count]
  NUM_CPUS            CPUs Ray may use on this node [NUM_DEVICES on cpu, else all]
  JOIN_TIMEOUT        seconds to keep trying to join [600]
  HEAD_LOST_TIMEOUT   leave after the head has been unreachable this long [30]
  RAY_TEMP_DIR        this node's dedicated Ray temp dir (also --temp-dir)
                      [${RAY_TMPDIR:-/tmp}/mindrl_ray_worker_${MASTER_PORT}]
  RAY_AUTH_MODE       token | disabled, as on the head [token: needs the head's token in
                      ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN]
  RAY_START_ARGS      extra `ray start` options
  STOP_GRACE          seconds between SIGTERM and SIGKILL when stopping [15]
  PYTHON              the Python that has mindrl and ray [python]
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON=${PYTHON:-python}
TEMP_DIR_ARG=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --temp-dir) TEMP_DIR_ARG=${2:?--temp-dir needs a folder}; shift 2 ;;
        --temp-dir=*) TEMP_DIR_ARG=${1#*=}; shift ;;
        *) echo "error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
if [[ -z ${MASTER_ADDR:-} ]]; then
    echo "error: set MASTER_ADDR to the head node's IP" >&2
    usage >&2
    exit 2
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
launch() { "$PYTHON" -m mindrl.cluster.launch "$@"; }
RAY=("$PYTHON" -m ray.scripts.scripts)

MASTER_PORT=${MASTER_PORT:-6344}
JOIN_TIMEOUT=${JOIN_TIMEOUT:-600}
HEAD_LOST_TIMEOUT=${HEAD_LOST_TIMEOUT:-30}
STOP_GRACE=${STOP_GRACE:-15}
HEAD="$MASTER_ADDR:$MASTER_PORT"

# -- devices of this node -----------------------------------------------------------------------
source "$(dirname "${BASH_SOURCE[0]}")/_node_devices.sh"

RAY_TEMP_DIR=${TEMP_DIR_ARG:-${RAY_TEMP_DIR:-${RAY_TMPDIR:-/tmp}/mindrl_ray_worker_${MASTER_PORT}}}
mkdir -p "$RAY_TEMP_DIR"
RAY_TEMP_DIR="$(cd "$RAY_TEMP_DIR" && pwd)"
NODE_LOG="$RAY_TEMP_DIR/ray_start_worker.log"
PIDS_FILE="$RAY_TEMP_DIR/stopped_pids.txt"

export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
export RAY_USAGE_STATS_ENABLED=0
if [[ $RAY_AUTH_MODE == token && -z ${RAY_AUTH_TOKEN:-} &&
    ! -s ${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token} ]]; then
    echo "error: RAY_AUTH_MODE=token but no token here: copy the head's ~/.ray/auth_token to" \
        "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token} or set RAY_AUTH_TOKEN" >&2
    exit 2
fi

# -- stop only what this script started -----------------------------------------------------------
NODE_PID=""
STARTED=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n $STARTED ]]; then
        echo "stopping the Ray node started here (temp dir $RAY_TEMP_DIR)"
        local roots=()
        [[ -n $NODE_PID ]] && roots+=(--root-pid "$NODE_PID")
        launch stop --temp-dir "$RAY_TEMP_DIR" ${roots[@]+"${roots[@]}"} --grace "$STOP_GRACE" \
            --record "$PIDS_FILE" || echo "warning: some processes did not stop" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

head_up() { timeout 3 bash -c "exec 3<>/dev/tcp/$MASTER_ADDR/$MASTER_PORT" 2>/dev/null; }
nap() { sleep "$1" & wait $! || true; }  # a sleep that a trapped signal interrupts

node_args=(
    start --block
    --address "$HEAD"
    --num-cpus "$NUM_CPUS"
    --temp-dir "$RAY_TEMP_DIR"
    --disable-usage-stats
    --log-style record --log-color false
)
[[ -n ${NODE_IP_ADDRESS:-} ]] && node_args+=(--node-ip-address "$NODE_IP_ADDRESS")
# shellcheck disable=SC2206  # word splitting of RAY_START_ARGS is the point
extra_ray_args=(${RAY_START_ARGS:-})

# -- join, retrying while the head is not up yet --------------------------------------------------
echo "joining the Ray head at $HEAD: $DEVICE_TYPE x $NUM_DEVICES, $NUM_CPUS CPU(s)," \
    "temp dir $RAY_TEMP_DIR, log $NODE_LOG (up to $JOIN_TIMEOUT s)"
deadline=$((SECONDS + JOIN_TIMEOUT))
attempt=0
while :; do
    if ((SECONDS >= deadline)); then
        echo "error: could not join $HEAD within $JOIN_TIMEOUT s ($attempt attempt(s))" >&2
        [[ -s $NODE_LOG ]] && tail -n 15 "$NODE_LOG" >&2
        exit 1
    fi
    if ! head_up; then
        nap 2
        continue
    fi
    attempt=$((attempt + 1))
    STARTED=1
    RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0} \
        "${RAY[@]}" "${node_args[@]}" ${ray_devices[@]+"${ray_devices[@]}"} \
        ${extra_ray_args[@]+"${extra_ray_args[@]}"} >"$NODE_LOG" 2>&1 &
    NODE_PID=$!
    while kill -0 "$NODE_PID" 2>/dev/null && ! grep -q "Ray runtime started" "$NODE_LOG" &&
        ((SECONDS < deadline)); do
        nap 1
    done
    if grep -q "Ray runtime started" "$NODE_LOG"; then
        break
    fi
    if kill -0 "$NODE_PID" 2>/dev/null; then
        continue  # out of time while starting: the top of the loop reports and exits
    fi
    rc=0
    wait "$NODE_PID" || rc=$?
    NODE_PID=""
    echo "attempt $attempt to join $HEAD failed (exit $rc); the end of $NODE_LOG:" >&2
    tail -n 5 "$NODE_LOG" >&2
    nap 3
done
echo "joined $HEAD (ray start pid $NODE_PID); this script stays up as long as the node"

# -- live as long as the node; leave when the head is gone ----------------------------------------
lost_since=""
while kill -0 "$NODE_PID" 2>/dev/null; do
    if head_up; then
        lost_since=""
    else
        lost_since=${lost_since:-$SECONDS}
        if ((SECONDS - lost_since >= HEAD_LOST_TIMEOUT)); then
            echo "the head $HEAD has been unreachable for $((SECONDS - lost_since)) s: leaving"
            exit 0
        fi
    fi
    nap 2
done
rc=0
wait "$NODE_PID" || rc=$?
if ! head_up; then
    echo "the Ray node ended after the head $HEAD went away"
    exit 0
fi
echo "error: the Ray node exited (status $rc) while the head is up; the end of $NODE_LOG:" >&2
tail -n 15 "$NODE_LOG" >&2
exit "$rc"
