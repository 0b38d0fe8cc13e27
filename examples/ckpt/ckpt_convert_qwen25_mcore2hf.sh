#!/usr/bin/env bash
# Qwen2.5-7B: megatron-core checkpoint (converted, or saved by training) -> HF safetensors.
# The checkpoint records its architecture and keeps the HF config / tokenizer files, so no
# model flags are needed; --tokenizer-model overrides the tokenizer files it kept.
set -euo pipefail

hf_model_path=${HF_MODEL_PATH:-/root/llmtuner/hfhub/models/Qwen/Qwen2.5-7B}
mcore_model_path=${MCORE_MODEL_PATH:-/root/llmtuner/hfhub/mindspeed/models/Qwen/Qwen2.5-7B/mcore_tp2_pp4}
hf_save_path=${HF_SAVE_PATH:-/root/llmtuner/hfhub/mindspeed/models/Qwen/Qwen2.5-7B/mg2hf}
params_dtype=${PARAMS_DTYPE:-bf16}
max_shard_size=${MAX_SHARD_SIZE:-5GB}

cd "$(dirname "$0")/../.."

python cli/convert_ckpt.py \
       --use-mcore-models \
       --model-type GPT \
       --load-model-type mg \
       --save-model-type hf \
       --load-dir "$mcore_model_path" \
       --save-dir "$hf_save_path" \
       --tokenizer-model "$hf_model_path/tokenizer.json" \
       --model-type-hf qwen25 \
       --params-dtype "$params_dtype" \
       --max-shard-size "$max_shard_size"
