"""With mindrl's CPU shims a megatron-core GPTModel trains on CPU; without them it cannot."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_megatron_cpu_step.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(apply_shims: bool) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(_free_port()), "1" if apply_shims else "0"],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.multiproc
def test_gpt_model_forward_backward_and_optimizer_step_on_cpu():
    proc = _run(apply_shims=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    losses, norms = result["losses"], result["grad_norms"]
    assert result["ok"] and result["grads_finite"]
    assert all(n > 0 for n in norms)
    assert losses[2] < losses[0], losses  # the optimizer really updated the weights


@pytest.mark.multiproc
def test_without_shims_megatron_hits_cuda():
    proc = _run(apply_shims=False)
    assert proc.returncode != 0
    assert "CUDA" in proc.stderr or "cuda" in proc.stderr
