#!/usr/bin/env bash
# DeepSeek-R1-Zero on Qwen2.5-7B, head node of a 2-node x 8-NPU cluster (MindSpeed-RL's recipe).
#
#   bash examples/r1/qwen25/r1_zero_qwen25_7b_master.sh [r1_zero_qwen25_7b.yaml] [key=value ...]
#   # every other node:
#   MASTER_ADDR=<this node's IP> bash examples/r1/qwen25/r1_zero_qwen25_7b_worker.sh
#
# A thin wrapper of examples/launch/master.sh (see its --help for every variable); the
# defaults below can be overridden from the environment. The driver's output also goes to
# logs/r1_zero_qwen25_7b_full.log.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
export CONFIG=${CONFIG:-r1_zero_qwen25_7b}
export NNODES=${NNODES:-2}
export DEVICE_TYPE=${DEVICE_TYPE:-npu}
export NUM_DEVICES=${NUM_DEVICES:-8}
export MASTER_PORT=${MASTER_PORT:-6344}
export LOG_FILE=${LOG_FILE:-$ROOT/logs/r1_zero_qwen25_7b_full.log}

exec bash "$ROOT/examples/launch/master.sh" "$@"
