"""Rollout correction: importance weights pi_old / pi_rollout, truncated or masked, and the
train/rollout mismatch metrics.

The rollout engine (vLLM, other kernels, other precision, older weights one or more steps
off) samples from pi_rollout, while the loss assumes samples from pi_old (the training
engine's log-probs before the update). Weighting each token's loss by pi_old / pi_rollout
corrects that (Yao et al., "Your efficient RL framework secretly brings you off-policy RL
training"; verl's rollout correction, whose names the config uses):

- level `token`: w_t = exp(log r_t), one weight per token, r_t = pi_old(t) / pi_rollout(t);
- level `sequence`: w = exp(sum_t log r_t), the product of the sequence's ratios, on each
  of its tokens (unbiased, high variance);
- level `geometric`: w = exp(mean_t log r_t), the geometric mean (bounded by length).

Mode `truncate` weighs by min(w, upper) (TIS); mode `mask` weighs by w inside
[lower, upper] and by 0 outside (the token or the whole sequence is dropped: rejection
sampling, OpenRLHF's icepop at token level). A dropped token keeps its place in the loss's
denominator, as a truncated one does: the correction reweights, it does not renormalise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mindrl.algorithms.aggregation import LOG_RATIO_CLAMP, masked_mean
from mindrl.algorithms.names import ROLLOUT_IS_LEVELS, ROLLOUT_IS_MODES


@dataclass(frozen=True)
class RolloutCorrection:
    """The correction's settings, as the loss config's rollout_is_* keys give them."""

    level: str = "token"
    mode: str = "truncate"
    upper: float = 2.0
    lower: float = 0.5  # mask mode only

    def __post_init__(self) -> None:
        if self.level not in ROLLOUT_IS_LEVELS:
            raise ValueError(f"rollout_is_level {self.level!r} is not one of {ROLLOUT_IS_LEVELS}")
        if self.mode not in ROLLOUT_IS_MODES:
            raise ValueError(f"rollout_is_mode {self.mode!r} is not one of {ROLLOUT_IS_MODES}")
        if self.upper <= 0:
            raise ValueError(f"rollout_is_threshold must be > 0, got {self.upper}")
        if self.mode == "mask" and not 0 < self.lower < self.upper:
            raise ValueError(
                f"mask mode needs 0 < lower ({self.lower}) < rollout_is_threshold ({self.upper})"
            )


@dataclass(frozen=True)
class CorrectionWeights:
    """Per-token weights [B, T] (no gradient; 1 on padding) and the metrics that describe
    them."""

    weights: torch.Tensor
    metrics: dict[str, float]


def _log_ratio(
    train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """log pi_train - log pi_rollout, 0 on padding (where either side may be -inf)."""
    diff = (train_log_prob.float() - rollout_log_prob.float()).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    return torch.where(response_mask.bool(), diff, diff.new_zeros(()))


def level_log_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The log of each token's level weight [B, T]: its own log ratio (token), or its
    sequence's summed (sequence) or mean (geometric) log ratio on every token of the row,
    bounded so the weight cannot overflow."""
    if level == "token":
        return log_ratio
    if level == "sequence":
        per_row = log_ratio.sum(dim=-1, keepdim=True)
    elif level == "geometric":
        per_row = masked_mean(log_ratio, mask, dim=-1)[:, None]
    else:
        raise ValueError(f"rollout_is_level {level!r} is not one of {ROLLOUT_IS_LEVELS}")
    return per_row.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).expand_as(log_ratio)


def _stats(values: torch.Tensor, prefix: str) -> dict[str, float]:
    """mean / std / min / max of a 1-D tensor (neutral weight 1, spread 0 when empty)."""
    if values.numel() == 0:
        return {
            f"{prefix}_{k}": v for k, v in (("mean", 1.0), ("std", 0.0), ("min", 1.0), ("max", 1.0))
        }
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_std": float(values.std(unbiased=False)),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
    }


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    settings: RolloutCorrection,
    prefix: str = "actor/rollout_is",
) -> CorrectionWeights:
    """The per-token weights the pg loss is multiplied by, and their metrics.

    Metrics (over valid tokens; the sequence levels also over rows with a valid token):
    `{prefix}_mean/_std/_min/_max` of the level's weight before truncation or masking,
    for token level per token, for the sequence levels per sequence;
    `{prefix}_clipfrac`: share of tokens whose weight was truncated (truncate mode);
    `{prefix}_masked_fraction` / `{prefix}_seq_masked_fraction`: share of tokens / of
    sequences with a token dropped (mask mode).
    """
    mask = response_mask.bool()
    with torch.no_grad():
        log_w = level_log_weights(
            _log_ratio(old_log_prob, rollout_log_prob, mask), mask, settings.level
        )
        raw = torch.exp(log_w)
        rows = mask.any(dim=-1)
        per_weight = raw[mask] if settings.level == "token" else raw[:, 0][rows]
        metrics = _stats(per_weight, prefix)
        if settings.mode == "truncate":
            weights = raw.clamp(max=settings.upper)
            truncated = (raw > settings.upper) & mask
            metrics[f"{prefix}_clipfrac"] = float(masked_mean(truncated.float(), mask))
        else:
            kept = (raw >= settings.lower) & (raw <= settings.upper)
            weights = torch.where(kept, raw, raw.new_zeros(()))
            dropped = ~kept & mask
            metrics[f"{prefix}_masked_fraction"] = float(masked_mean(dropped.float(), mask))
            dropped_rows = dropped.any(dim=-1)[rows]
            metrics[f"{prefix}_seq_masked_fraction"] = (
                float(dropped_rows.float().mean()) if dropped_rows.numel() else 0.0
            )
        weights = torch.where(mask, weights, weights.new_ones(()))
    return CorrectionWeights(weights, metrics)


def tis_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float = 2.0,
) -> torch.Tensor:
    """Token-level truncated importance sampling: min(exp(old - rollout), cap) per token,
    no gradient; 1 on padding."""
    settings = RolloutCorrection("token", "truncate", upper=cap)
    return rollout_correction(old_log_prob, rollout_log_prob, response_mask, settings).weights


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
