"""Two more places where megatron-core 0.16 hard-codes CUDA on paths mindrl uses on CPU.

They complement `mindrl.accelerator.megatron_shims` (which the lead owns; these belong there
and are kept here, applied only on CPU, until they move):

1. `pipeline_parallel.schedules.forward_backward_*` build
   `torch.zeros([], dtype=torch.int, device="cuda")` for the token count of every schedule
   (no pipelining, pipelining, interleaved). `apply_schedule_shim` gives the schedules module
   a `torch` whose `zeros` maps device "cuda" to "cpu"; everything else is the real torch.
2. `LanguageModule.setup_embeddings_and_output_layer` calls `weight.data.cuda()` on the tied
   output-layer copy when PP > 1; `mindrl.models.gpt` keeps that tensor in place while the
   model is built (`_cpu_tensor_cuda_identity`).
"""

from __future__ import annotations

from typing import Any

_APPLIED = False


class _TorchWithCpuZeros:
    """The torch module, except that zeros(..., device="cuda") lands on the CPU."""

    def __init__(self, torch_module: Any):
        self._torch = torch_module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def zeros(self, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "cpu"
        return self._torch.zeros(*args, **kwargs)


def apply_schedule_shim() -> None:
    """Idempotent; call only on CPU."""
    global _APPLIED
    if _APPLIED:
        return
    import torch
    from megatron.core.pipeline_parallel import schedules

    if isinstance(schedules.torch, _TorchWithCpuZeros):
        _APPLIED = True
        return
    schedules.torch = _TorchWithCpuZeros(torch)
    _APPLIED = True
