#!/usr/bin/env bash
# Qwen2.5-7B: HF weights -> megatron-core checkpoint for GRPO training.
# The actor trains at TP2 PP4 and the reference at TP2 PP2; a dist_checkpointing folder stores
# global tensors, so one converted folder loads at either layout (tp/pp below are validated
# against the model and recorded in the checkpoint).
set -euo pipefail

hf_model_path=${HF_MODEL_PATH:-/root/llmtuner/hfhub/models/Qwen/Qwen2.5-7B}
mcore_model_path=${MCORE_MODEL_PATH:-/root/llmtuner/hfhub/mindspeed/models/Qwen/Qwen2.5-7B}
tp=${TP:-2}
pp=${PP:-4}
params_dtype=${PARAMS_DTYPE:-bf16}

cd "$(dirname "$0")/../.."

python cli/convert_ckpt.py \
       --use-mcore-models \
       --model-type GPT \
       --load-model-type hf \
       --save-model-type mg \
       --target-tensor-parallel-size "$tp" \
       --target-pipeline-parallel-size "$pp" \
       --add-qkv-bias \
       --load-dir "$hf_model_path" \
       --save-dir "$mcore_model_path/mcore_tp${tp}_pp${pp}" \
       --tokenizer-model "$hf_model_path/tokenizer.json" \
       --model-type-hf qwen25 \
       --params-dtype "$params_dtype"
