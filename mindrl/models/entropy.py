"""Per-token entropy of the model's distribution from tensor-parallel vocab slices."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindrl.models.vocab_slice import masked_float_logits, tp_rank_size

if TYPE_CHECKING:
    import torch


def entropy_from_log_probs(logp: torch.Tensor) -> torch.Tensor:
    """-sum p log p over the last dim; padded rows (log p = -inf) add 0, not NaN, and so
    does their gradient (0 * -inf never appears, forward or backward)."""
    import torch

    finite = torch.where(torch.isinf(logp), torch.zeros_like(logp), logp)
    return -(logp.exp() * finite).sum(-1)


def vocab_parallel_entropy(logits: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """H = logsumexp(x) - sum(softmax(x) * x) over the full vocabulary, fp32, differentiable.

    `logits` is this TP rank's [..., V/TP] slice; rows >= vocab_size are padding and excluded.
    The partial sums are all-reduced over the TP group (identity backward, as megatron's
    vocab-parallel cross entropy does), so every TP rank returns the same entropy.
    """
    import torch

    x = masked_float_logits(logits, vocab_size, 1.0)
    _, tp_size = tp_rank_size()
    if tp_size == 1:
        return entropy_from_log_probs(torch.log_softmax(x, dim=-1))
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    with torch.no_grad():
        local_max = x.max(dim=-1, keepdim=True).values
        global_max = local_max.clone()
        dist.all_reduce(
            global_max, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group()
        )
    shifted = x - global_max
    exp = torch.where(torch.isinf(shifted), torch.zeros_like(shifted), shifted.exp())
    sum_exp = reduce_from_tensor_model_parallel_region(exp.sum(-1))
    finite = torch.where(torch.isinf(shifted), torch.zeros_like(shifted), shifted)
    sum_exp_x = reduce_from_tensor_model_parallel_region((exp * finite).sum(-1))
    return sum_exp.log() - sum_exp_x / sum_exp
