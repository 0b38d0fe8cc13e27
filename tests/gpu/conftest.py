"""The GPU tier: what tests/integration runs over gloo on CPU, run on one NVIDIA GPU.

Every test here is skipped where torch sees no CUDA device (`make test-gpu` runs the tier).
The tests need only torch, transformers and mindrl's own requirements; the vLLM test also
skips without vLLM's CUDA build.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def cuda_reason() -> str | None:
    """Why the tier cannot run here (None: it can)."""
    import torch

    if not torch.cuda.is_available():
        return "tests/gpu needs a CUDA device (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(skip)
