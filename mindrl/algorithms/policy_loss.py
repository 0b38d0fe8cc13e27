"""PPO clipped policy-gradient loss with clip-higher (DAPO) and dual-clip.

Per token, with ratio r = exp(log_prob - old_log_prob) and advantage A:
- A > 0: loss = -A * min(r, 1 + eps_high)          (clip-higher: eps_high >= eps_low)
- A < 0: loss = -A * min(max(r, 1 - eps_low), c)   (dual-clip caps the loss at -A * c)
- A = 0: loss = 0.
This is max(-A r, -A clip(r)) and, for A < 0, its min with -A c (verl's form), written as
explicit selections so a clipped token carries exactly zero gradient and a ratio exactly on a
bound counts as unclipped (strict inequalities, as verl's clip fractions).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mindrl.algorithms.aggregation import aggregate_loss, masked_mean
from mindrl.algorithms.gspo import gspo_token_losses
from mindrl.algorithms.names import POLICY_LOSS_MODES
from mindrl.algorithms.ratios import LOG_RATIO_CLAMP, ClippedTokens, clipped_surrogate


class PolicyLoss(NamedTuple):
    loss: torch.Tensor  # scalar, aggregated with the mask
    pg_clipfrac: float  # fraction of valid tokens where the PPO bound is active
    ppo_kl: float  # token mean of old_log_prob - log_prob: approx KL(old || new)
    pg_clipfrac_lower: float  # fraction of valid tokens where the dual-clip cap is active


def ppo_clip_token_losses(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
) -> ClippedTokens:
    """Per-token clipped losses; `clip_ratio` is the low bound, `clip_ratio_high` the high
    (defaults to `clip_ratio`), `clip_ratio_c` the dual-clip cap (None disables it)."""
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    adv = advantages.float()
    log_ratio = (log_prob.float() - old_log_prob.float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    losses, clip_high, clip_low = clipped_surrogate(adv, ratio, clip_ratio, clip_ratio_high)
    if clip_ratio_c is not None:
        dual = (adv < 0) & (ratio > clip_ratio_c)
        losses = torch.where(dual, -adv * clip_ratio_c, losses)
    else:
        dual = torch.zeros_like(clip_high)
    return ClippedTokens(losses, ratio, clip_high | clip_low, dual)


def compute_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    *,
    token_weights: torch.Tensor | None = None,
    horizon: int | None = None,
    normalizer: float | None = None,
    mode: str = "vanilla",
) -> PolicyLoss:
    """Aggregated clipped pg loss and its clip/KL metrics (metrics are token means).

    `token_weights` (e.g. truncated importance weights, no gradient) scale each token's loss.
    `mode` "gspo" clips one ratio per sequence (`mindrl.algorithms.gspo`; no dual clip).
    """
    if mode == "gspo":
        tokens = gspo_token_losses(
            log_prob, old_log_prob, advantages, response_mask, clip_ratio, clip_ratio_high
        )
    elif mode == "vanilla":
        tokens = ppo_clip_token_losses(
            log_prob, old_log_prob, advantages, clip_ratio, clip_ratio_high, clip_ratio_c
        )
    else:
        raise ValueError(f"unknown policy loss mode {mode!r}; expected one of {POLICY_LOSS_MODES}")
    losses = tokens.losses if token_weights is None else tokens.losses * token_weights.detach()
    loss = aggregate_loss(
        losses, response_mask, loss_agg_mode, horizon=horizon, normalizer=normalizer
    )
    with torch.no_grad():
        ppo_kl = masked_mean(old_log_prob.float() - log_prob.float(), response_mask)
        clipfrac = masked_mean(tokens.clipped.float(), response_mask)
        clipfrac_lower = masked_mean(tokens.dual_clipped.float(), response_mask)
    return PolicyLoss(loss, float(clipfrac), float(ppo_kl), float(clipfrac_lower))
