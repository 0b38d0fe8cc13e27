#!/usr/bin/env bash
# Single-node GRPO on Qwen2.5-7B (configs/grpo_qwen25_7b.yaml: 8 Ascend NPUs; actor TP4 with
# vLLM rollout inside it, reference TP2). Extra arguments are Hydra overrides, e.g.
#   bash examples/grpo/grpo_trainer_qwen25_7b.sh actor_config.lr=5e-7 runtime.accelerator=cuda
set -euo pipefail
cd "$(dirname "$0")/../.."

CONFIG="${CONFIG:-grpo_qwen25_7b}"
LOG_DIR="${LOG_DIR:-logs}"
mkdir -p "$LOG_DIR"

export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1800}"      # NPU collectives at start-up
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"

python cli/train_grpo.py --config-name "$CONFIG" "$@" 2>&1 | tee "$LOG_DIR/${CONFIG}.log"
exit "${PIPESTATUS[0]}"
