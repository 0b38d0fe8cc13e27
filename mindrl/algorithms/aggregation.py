"""Masked reductions and loss aggregation over [B, T] token matrices.

Every reduction here treats an empty selection (no valid token, no valid sequence) as
contributing zero instead of dividing by zero: an all-masked micro-batch (e.g. every response
overlong-filtered) must give a finite loss with zero gradient, never NaN.
"""

from __future__ import annotations

import torch

from mindrl.algorithms.names import LOSS_AGG_MODES

# the bound on a log ratio before it is exponentiated (exp(20) ~ 5e8): one wild token cannot
# overflow a ratio in fp32; shared by the policy ratio, the KL estimators and TIS
LOG_RATIO_CLAMP = 20.0

WHITEN_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set; masked entries are replaced, not multiplied by 0."""
    kept = torch.where(mask.bool(), values, values.new_zeros(()))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over masked entries; 0 where nothing is selected."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    horizon: int | None = None,
    normalizer: float | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    - token-mean: sum over valid tokens / number of valid tokens.
    - seq-mean-token-mean: each sequence's token mean, averaged over sequences.
    - seq-mean-token-sum: each sequence's token sum, averaged over sequences.
    - seq-mean-token-sum-norm (Dr.GRPO): each sequence's token sum / `horizon` (a constant,
      default T), averaged over sequences. verl divides the batch total by T without the
      1/B factor; averaging keeps the loss scale independent of the batch size.

    Sequence means run over sequences with at least one valid token, so responses masked out
    entirely (overlong filter) do not dilute the rest. `normalizer` replaces the local count
    (tokens for token-mean, sequences otherwise) so that micro-batches of one global batch can
    each divide by the global count and their gradients add up to the global-batch mean.
    """
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(
            f"loss {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must be [B, T]"
        )
    valid = mask.bool()
    if mode == "token-mean":
        total = masked_sum(loss_mat, valid)
        count = valid.sum().to(loss_mat.dtype)
    elif mode in LOSS_AGG_MODES:
        token_sum = masked_sum(loss_mat, valid, dim=-1)
        lengths = valid.sum(dim=-1).to(loss_mat.dtype)
        if mode == "seq-mean-token-mean":
            per_seq = token_sum / lengths.clamp(min=1.0)
        elif mode == "seq-mean-token-sum":
            per_seq = token_sum
        else:
            norm = horizon if horizon is not None else loss_mat.shape[-1]
            if norm <= 0:
                raise ValueError(f"horizon must be > 0, got {norm}")
            per_seq = token_sum / float(norm)
        total = per_seq.sum()  # empty rows contribute exactly 0
        count = (lengths > 0).sum().to(loss_mat.dtype)
    else:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {LOSS_AGG_MODES}")
    if normalizer is not None:
        if normalizer <= 0:
            raise ValueError(f"normalizer must be > 0, got {normalizer}")
        return total / normalizer
    return total / count.clamp(min=1.0)


def whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over valid tokens (unbiased var), zero on padding."""
    valid = mask.bool()
    mean = masked_mean(values, valid)
    count = valid.sum().to(values.dtype)
    sq_dev = masked_sum((values - mean) ** 2, valid)
    var = sq_dev / (count - 1.0) if count >= 2 else torch.zeros_like(sq_dev)
    out = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    return torch.where(valid, out, torch.zeros_like(out))
