#!/usr/bin/env bash
# Multi-node GRPO, head node: start the Ray head, wait until NNODES nodes have joined, run
# cli/train_grpo.py against that cluster, and on exit stop exactly the processes started here.
# Every other node runs examples/launch/worker.sh with the same MASTER_ADDR / MASTER_PORT.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bash examples/launch/master.sh [--temp-dir DIR] [--include-dashboard=true|false]
                                      CONFIG [train_grpo.py args / key=value overrides ...]
       (--temp-dir and --include-dashboard are this script's; every other argument after
        CONFIG goes to train_grpo.py, e.g. --dry-run to check the plan against the cluster)

Starts `ray start --head` on this node, waits until NNODES nodes are alive (JOIN_TIMEOUT s),
then runs `python cli/train_grpo.py --config-name CONFIG runtime.ray_address=ADDR ARGS...`.
When the driver ends (or on Ctrl-C / SIGTERM) the Ray processes started by this script, and
only those, are stopped. The exit status is the driver's (1 when the nodes did not join).

environment (defaults in brackets):
  CONFIG              config name under configs/, when not given as an argument
  MASTER_ADDR         this node's IP, which the workers connect to [detected as Ray does];
                      127.0.0.1 / localhost / ::1 keep every Ray process on loopback (one node)
  MASTER_PORT         Ray head (GCS) port [6344]
  NNODES              nodes to wait for, this one included [1]
  DEVICE_TYPE         npu | gpu | cpu [detected: npu-smi/torch_npu, nvidia-smi, else cpu]
  NUM_DEVICES         devices of this node [detected; on cpu: the CPU count]
  NUM_CPUS            CPUs Ray may use on this node [NUM_DEVICES on cpu, else all]
  JOIN_TIMEOUT        seconds the other nodes get to join, counted once the head is up [600]
  HEAD_START_TIMEOUT  seconds the head itself gets to come up [180]
  DASHBOARD_HOST      address the dashboard binds [127.0.0.1: loopback only]
  DASHBOARD_PORT      [8260]
  INCLUDE_DASHBOARD   true | false [true]
  RAY_TEMP_DIR        this node's dedicated Ray temp dir (also --temp-dir)
                      [${RAY_TMPDIR:-/tmp}/mindrl_ray_head_${MASTER_PORT}]
  RAY_AUTH_MODE       token | disabled [token; a token is generated in ~/.ray/auth_token if
                      none exists: copy it to every worker node, or set RAY_AUTH_TOKEN]
  RAY_START_ARGS      extra `ray start` options, e.g. "--object-store-memory 4000000000"
  LOG_FILE            also append the driver's output to this file
  STOP_GRACE          seconds between SIGTERM and SIGKILL when stopping [15]
  PYTHON              the Python that has mindrl and ray [python]
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON=${PYTHON:-python}
INCLUDE_DASHBOARD=${INCLUDE_DASHBOARD:-true}
TEMP_DIR_ARG=""
passthrough=()  # this script's own options may come anywhere; the rest goes to train_grpo.py
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --temp-dir) TEMP_DIR_ARG=${2:?--temp-dir needs a folder}; shift 2 ;;
        --temp-dir=*) TEMP_DIR_ARG=${1#*=}; shift ;;
        --include-dashboard) INCLUDE_DASHBOARD=${2:?needs true or false}; shift 2 ;;
        --include-dashboard=*) INCLUDE_DASHBOARD=${1#*=}; shift ;;
        *) passthrough+=("$1"); shift ;;
    esac
done
set -- ${passthrough[@]+"${passthrough[@]}"}
if [[ $# -gt 0 && $1 != -* && $1 != *=* ]]; then
    CONFIG=$1
    shift
fi
case "$INCLUDE_DASHBOARD" in
    true | false) ;;
    *) echo "error: --include-dashboard=true|false, not '$INCLUDE_DASHBOARD'" >&2; exit 2 ;;
esac
if [[ -z ${CONFIG:-} ]]; then
    echo "error: no CONFIG given" >&2
    usage >&2
    exit 2
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
launch() { "$PYTHON" -m mindrl.cluster.launch "$@"; }
RAY=("$PYTHON" -m ray.scripts.scripts)

MASTER_PORT=${MASTER_PORT:-6344}
NNODES=${NNODES:-1}
JOIN_TIMEOUT=${JOIN_TIMEOUT:-600}
HEAD_START_TIMEOUT=${HEAD_START_TIMEOUT:-180}
DASHBOARD_HOST=${DASHBOARD_HOST:-127.0.0.1}
DASHBOARD_PORT=${DASHBOARD_PORT:-8260}
STOP_GRACE=${STOP_GRACE:-15}
MASTER_ADDR=${MASTER_ADDR:-$(launch node-ip)}
# Ray turns a node IP of 127.0.0.1 into this machine's routable address and then listens on all
# interfaces; this Ray setting (read at import) keeps a loopback head on loopback (GCS, raylet,
# workers, agents, metrics), as the embedded cluster does (mindrl/cluster/ray_cluster.py).
# Any other address: Ray 2.60's gRPC servers and agents still listen on all interfaces.
case "${NODE_IP_ADDRESS:-$MASTER_ADDR}" in
    127.0.0.1 | localhost | ::1) export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ;;
esac

# -- devices of this node -----------------------------------------------------------------------
source "$(dirname "${BASH_SOURCE[0]}")/_node_devices.sh"

# -- this node's own Ray folder: what is stopped later is found through it ------------------------
RAY_TEMP_DIR=${TEMP_DIR_ARG:-${RAY_TEMP_DIR:-${RAY_TMPDIR:-/tmp}/mindrl_ray_head_${MASTER_PORT}}}
mkdir -p "$RAY_TEMP_DIR"
RAY_TEMP_DIR="$(cd "$RAY_TEMP_DIR" && pwd)"
HEAD_LOG="$RAY_TEMP_DIR/ray_start_head.log"
PIDS_FILE="$RAY_TEMP_DIR/stopped_pids.txt"

# -- auth: Ray 2.60 uses token auth when a token exists; every node and the driver must agree ----
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
export RAY_USAGE_STATS_ENABLED=0
if [[ $RAY_AUTH_MODE == token && -z ${RAY_AUTH_TOKEN:-} ]]; then
    token_file=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}
    if [[ ! -s $token_file ]]; then
        if [[ -n ${RAY_AUTH_TOKEN_PATH:-} ]]; then
            echo "error: RAY_AUTH_TOKEN_PATH=$token_file does not exist" >&2
            exit 2
        fi
        "${RAY[@]}" get-auth-token --generate >/dev/null
        echo "generated a Ray auth token in $token_file: copy it to every worker node"
    fi
fi

# -- stop only what this script started -----------------------------------------------------------
HEAD_PID=""
CHILD_PID=""
CHILD_WHAT=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # the driver (or the wait) first, while the cluster it talks to is still up; then the head
    if [[ -n $CHILD_PID ]] && kill -0 "$CHILD_PID" 2>/dev/null; then
        echo "stopping $CHILD_WHAT (pid $CHILD_PID)"
        launch stop --root-pid "$CHILD_PID" --grace "$STOP_GRACE" --record "$PIDS_FILE" ||
            echo "warning: some of its processes did not stop" >&2
    fi
    if [[ -n $HEAD_PID ]]; then
        echo "stopping the Ray head started here (temp dir $RAY_TEMP_DIR)"
        launch stop --temp-dir "$RAY_TEMP_DIR" --root-pid "$HEAD_PID" --grace "$STOP_GRACE" \
            --record "$PIDS_FILE" || echo "warning: some processes did not stop" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Run a command as a child and wait for it: a signal to this script interrupts `wait` at once
# (a foreground command would delay the trap until it ends), and cleanup can stop the child.
# usage: run_child WHAT COMMAND [ARGS...]
run_child() {
    CHILD_WHAT=$1
    shift
    "$@" &
    CHILD_PID=$!
    local rc=0
    wait "$CHILD_PID" || rc=$?
    CHILD_PID=""
    return "$rc"
}

# -- head ---------------------------------------------------------------------------------------
head_args=(
    start --head --block
    --port "$MASTER_PORT"
    --node-ip-address "${NODE_IP_ADDRESS:-$MASTER_ADDR}"
    --num-cpus "$NUM_CPUS"
    --temp-dir "$RAY_TEMP_DIR"
    --dashboard-port "$DASHBOARD_PORT"
    --disable-usage-stats
    --log-style record --log-color false
)
if [[ $INCLUDE_DASHBOARD == true ]]; then
    head_args+=(--include-dashboard true --dashboard-host "$DASHBOARD_HOST")
else
    head_args+=(--include-dashboard false)
fi
# shellcheck disable=SC2206  # word splitting of RAY_START_ARGS is the point
extra_ray_args=(${RAY_START_ARGS:-})

echo "starting the Ray head on $MASTER_ADDR:$MASTER_PORT: $DEVICE_TYPE x $NUM_DEVICES," \
    "$NUM_CPUS CPU(s), temp dir $RAY_TEMP_DIR, log $HEAD_LOG"
# Drain 0: `ray start` would otherwise wait up to 30 s on SIGTERM before stopping its processes.
RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0} \
    "${RAY[@]}" "${head_args[@]}" ${ray_devices[@]+"${ray_devices[@]}"} \
    ${extra_ray_args[@]+"${extra_ray_args[@]}"} >"$HEAD_LOG" 2>&1 &
HEAD_PID=$!

RAY_ADDRESS="$MASTER_ADDR:$MASTER_PORT"
if ! run_child "the wait for the nodes" launch wait-nodes --address "$RAY_ADDRESS" \
    --nodes "$NNODES" --timeout "$JOIN_TIMEOUT" --head-timeout "$HEAD_START_TIMEOUT" \
    --pid "$HEAD_PID"; then
    if ! kill -0 "$HEAD_PID" 2>/dev/null; then
        echo "error: the Ray head did not start; the end of $HEAD_LOG:" >&2
        tail -n 20 "$HEAD_LOG" >&2
    fi
    exit 1
fi

# -- driver -------------------------------------------------------------------------------------
export RAY_ADDRESS
cd "$ROOT"
driver=("$PYTHON" cli/train_grpo.py --config-name "$CONFIG" "runtime.ray_address=$RAY_ADDRESS" "$@")
echo "+ ${driver[*]}"
if [[ -n ${LOG_FILE:-} ]]; then
    mkdir -p "$(dirname "$LOG_FILE")"
    run_child "the driver" "${driver[@]}" > >(tee -a "$LOG_FILE") 2>&1
else
    run_child "the driver" "${driver[@]}"
fi
