"""Rollout/training mismatch: truncated importance sampling (TIS) and mismatch metrics.

The rollout engine (vLLM, other kernels, other precision) samples from pi_rollout, while the
loss assumes samples from pi_old (the training engine's log-probs before the update). The
token weight pi_old / pi_rollout corrects that; truncating it at `cap` bounds the variance
(Yao et al., "Your efficient RL framework secretly brings you off-policy RL training").
"""

from __future__ import annotations

import torch

from mindrl.algorithms.aggregation import LOG_RATIO_CLAMP, masked_mean


def _log_ratio(
    train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """log pi_train - log pi_rollout, 0 on padding (where either side may be -inf)."""
    diff = (train_log_prob.float() - rollout_log_prob.float()).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    return torch.where(response_mask.bool(), diff, diff.new_zeros(()))


def tis_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float = 2.0,
) -> torch.Tensor:
    """min(exp(old_log_prob - rollout_log_prob), cap) per token, no gradient; 1 on padding."""
    if cap <= 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    with torch.no_grad():
        return torch.exp(_log_ratio(old_log_prob, rollout_log_prob, response_mask)).clamp(max=cap)


def rollout_mismatch_metrics(
    train_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
) -> dict[str, float]:
    """Over valid tokens: mean and max of |log pi_train - log pi_rollout|, and the mean k3
    estimate of KL(pi_rollout || pi_train) (tokens were sampled from the rollout side)."""
    with torch.no_grad():
        log_r = _log_ratio(train_log_prob, rollout_log_prob, response_mask)
        k3 = torch.exp(log_r) - 1.0 - log_r
        return {
            "rollout/logprob_abs_diff": float(masked_mean(log_r.abs(), response_mask)),
            "rollout/logprob_abs_diff_max": float(log_r.abs().max()) if log_r.numel() else 0.0,
            "rollout/k3_kl": float(masked_mean(k3, response_mask)),
        }
