"""This TP rank's slice of the padded vocabulary: where it sits and which of its rows are padding.

Shared by the log-prob and the entropy passes, which both start from the local logits with the
padded rows masked out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def tp_rank_size() -> tuple[int, int]:
    """(TP rank, TP size); (0, 1) when megatron's parallel state is not set up (plain tests)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def masked_float_logits(
    logits: torch.Tensor, vocab_size: int | None, temperature: float
) -> torch.Tensor:
    """fp32 copy of the local logits / temperature with padded vocab rows at -inf."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    if vocab_size is not None:
        tp_rank, _ = tp_rank_size()
        first_pad = vocab_size - tp_rank * logits.shape[-1]
        if first_pad < logits.shape[-1]:
            if x is logits:  # copy only when padding rows must be written
                x = x.clone()
            x[..., max(first_pad, 0) :] = float("-inf")
    return x
