#!/usr/bin/env bash
# DeepSeek-R1-Zero on Qwen2.5-7B, every node but the head (8 NPUs each).
#
#   MASTER_ADDR=<head node's IP> bash examples/r1/qwen25/r1_zero_qwen25_7b_worker.sh
#
# A thin wrapper of examples/launch/worker.sh (see its --help for every variable); the
# defaults below can be overridden from the environment.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
export DEVICE_TYPE=${DEVICE_TYPE:-npu}
export NUM_DEVICES=${NUM_DEVICES:-8}
export MASTER_PORT=${MASTER_PORT:-6344}

exec bash "$ROOT/examples/launch/worker.sh" "$@"
