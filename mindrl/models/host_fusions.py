"""Fused kernels for MindSpeed's `use_fused_rmsnorm` / `use_fused_swiglu` off the NPU.

MindSpeed hands these switches to torch_npu's fused kernels. Elsewhere mindrl fuses the same
two operations itself, so a MindSpeed-RL YAML (which sets both) runs unchanged on CPU and
GPU and gets what the switch promises: fewer passes over the activations and fewer of them
kept for the backward.

* RMSNorm: torch.compile'd (dynamic shapes) forward and backward with torch's RMSNorm math
  (fp32 statistics and scaling, one rounding to the input's dtype); it keeps the
  input and one fp32 number per token for the backward, where the eager norm keeps fp32
  copies of its input and output (~12 bytes per element).
* SwiGLU: megatron's own fused SwiGLU (`bias_activation_fusion`, compiled by megatron's
  `jit_fuser`), which keeps only its input (`transformer_overrides` in `models/scale.py`).

The first call of each graph compiles (seconds, once per process; inductor caches kernels on
disk). A transformer-engine layer spec has fused norms of its own and has no torch norm to
swap. Where the compiler cannot build (no C++ compiler on the host), the norm says so once
and runs torch's eager RMSNorm: the same numbers, the eager memory.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# where mindrl builds these kernels itself; on NPU the switches go to MindSpeed's adaptor
FUSED_BY_MINDRL_ON = ("cpu", "cuda")


def mindrl_fuses_here() -> bool:
    from mindrl.accelerator import get_accelerator

    return get_accelerator().name in FUSED_BY_MINDRL_ON


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch's RMSNorm, written out so the compiler can fuse it: the statistics, the
    normalisation and the weight in fp32, rounded to the input's dtype once (as torch's CPU
    kernel does: eagerly the outputs agree bit for bit)."""
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


@functools.cache
def _compiled_rms_norm() -> Any:
    import torch

    return torch.compile(rms_norm, dynamic=True)


_compiler_failed: list[BaseException] = []  # the first compile failure, if any


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The compiled norm; torch's eager one once the compiler has failed in this process."""
    import torch

    if not _compiler_failed:
        try:
            return _compiled_rms_norm()(x, weight, eps)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            _compiler_failed.append(exc)
            logger.warning(
                "use_fused_rmsnorm: torch.compile cannot build the fused RMSNorm here (%s); "
                "running torch's eager RMSNorm (same numbers, more activation memory)",
                str(exc).splitlines()[0][:200],
            )
    return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)


@functools.cache
def _fused_norm_class() -> type:
    import torch

    class FusedRMSNorm(torch.nn.RMSNorm):
        """torch.nn.RMSNorm whose forward is `fused_rms_norm` (same parameters, same
        state-dict keys, same attributes such as megatron's `sequence_parallel`)."""

        fused = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
            return fused_rms_norm(x, self.weight, eps)

    return FusedRMSNorm


def use_fused_rms_norm(model: Any) -> int:
    """Swap every torch RMSNorm in `model` (over its last dimension, with a weight) for the
    fused one, in place; returns how many were swapped."""
    import torch

    fused = _fused_norm_class()
    swapped = 0
    for module in model.modules():
        if (
            type(module) is torch.nn.RMSNorm
            and module.weight is not None
            and len(module.normalized_shape) == 1
        ):
            module.__class__ = fused
            swapped += 1
    return swapped
