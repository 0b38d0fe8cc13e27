"""CPU shims for megatron-core's MoE layer (applied by `apply_cpu_shims`, CPU only).

`MoEAlltoAllTokenDispatcher` creates a `torch.cuda.Stream()` in its constructor and copies the
token counts of each expert / EP rank to the host on that side stream
(`_maybe_dtoh_and_synchronize`). On CPU the counts are host tensors already: the stream is
never created, and the split sizes become the numpy arrays the CUDA path makes (the all-to-all
and the permutation read them as host sizes).

Without transformer_engine, megatron-core 0.16's `moe_utils` leaves `te_general_gemm`
undefined (its import fallback sets no name), so the router's gating linear raises NameError:
it is set to None, the value the router checks for.
"""

from __future__ import annotations

from typing import Any

_NO_STREAM = object()  # stands in for the class-level side stream on CPU


def _host(value: Any, as_numpy: bool = False) -> Any:
    import torch

    if torch.is_tensor(value) and as_numpy:
        return value.cpu().numpy()
    return value


def _dtoh_cpu(self: Any, point: str, tokens_per_expert: Any = None) -> Any:
    """`_maybe_dtoh_and_synchronize` without streams: same values, same point."""
    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        self.input_splits = _host(self.input_splits, as_numpy=True)
        self.output_splits = _host(self.output_splits, as_numpy=True)
        self.output_splits_tp = _host(self.output_splits_tp, as_numpy=True)
    return tokens_per_expert


def patch_moe_dispatcher_cpu() -> None:
    """Make the alltoall dispatcher build and run without CUDA (idempotent)."""
    try:
        from megatron.core.transformer.moe import moe_utils
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    except ImportError:  # megatron-core without MoE: nothing to patch
        return
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
        MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _NO_STREAM
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = _dtoh_cpu
