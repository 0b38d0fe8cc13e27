"""With mindrl's CPU shims a megatron-core GPTModel trains on CPU; without them it cannot."""

from __future__ import annotations

from pathlib import Path

from tests.fresh_process import free_port

SCRIPT = Path(__file__).with_name("_megatron_cpu_step.py")
TIMEOUT_S = 240.0


def test_gpt_model_forward_backward_and_optimizer_step_on_cpu(fresh_process):
    args = {"port": free_port(), "apply_shims": True}
    result = fresh_process(SCRIPT, args, timeout_s=TIMEOUT_S)
    losses, norms = result["losses"], result["grad_norms"]
    assert result["ok"] and result["grads_finite"]
    assert all(n > 0 for n in norms)
    assert losses[2] < losses[0], losses  # the optimizer really updated the weights


def test_without_shims_megatron_hits_cuda(fresh_process):
    run = fresh_process.run(
        SCRIPT, {"port": free_port(), "apply_shims": False}, timeout_s=TIMEOUT_S
    )
    assert run.returncode != 0 and run.result is None
    assert "CUDA" in run.stderr or "cuda" in run.stderr
