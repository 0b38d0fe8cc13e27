"""The clipped policy-gradient losses: PPO's per-token ratio with clip-higher (DAPO) and
dual-clip, and GSPO's per-sequence ratio; both share the log-ratio clamp, the clipped
surrogate and their per-token result (`ClippedTokens`).

PPO: per token, with ratio r = exp(log_prob - old_log_prob) and advantage A:
- A > 0: loss = -A * min(r, 1 + eps_high)          (clip-higher: eps_high >= eps_low)
- A < 0: loss = -A * min(max(r, 1 - eps_low), c)   (dual-clip caps the loss at -A * c)
- A = 0: loss = 0.
This is max(-A r, -A clip(r)) and, for A < 0, its min with -A c (verl's form), written as
explicit selections so a clipped token carries exactly zero gradient and a ratio exactly on a
bound counts as unclipped (strict inequalities, as verl's clip fractions).

GSPO (`mode="gspo"`; Zheng et al. 2025, "Group Sequence Policy Optimization"): one
importance ratio per sequence, clipped per sequence.

    s_i = exp( (1 / |y_i|) * sum_t (log pi(y_i,t) - log pi_old(y_i,t)) )

the geometric mean of the token ratios of response i. Per token the objective uses the
GSPO-token form s_i,t = sg[s_i] * pi(y_i,t) / sg[pi(y_i,t)]: numerically s_i on every token
of the sequence, with the gradient of s_i spread as s_i * grad log pi(y_i,t) / |y_i| once
the per-sequence token mean is taken (loss_agg_mode seq-mean-token-mean, the paper's
objective). Clipping works as PPO's, on s_i: A > 0 and s_i > 1 + eps_high, or A < 0 and
s_i < 1 - eps_low, gives the clipped constant (zero gradient for the whole sequence).
The paper's ranges are tiny (eps_low 3e-4, eps_high 4e-4): a sequence ratio moves much
less than a token ratio.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mindrl.algorithms.aggregation import (
    LOG_RATIO_CLAMP,
    aggregate_loss,
    masked_mean,
    masked_sum,
)
from mindrl.algorithms.names import POLICY_LOSS_MODES


class ClippedTokens(NamedTuple):
    losses: torch.Tensor  # [B, T] per-token pg loss
    ratio: torch.Tensor  # [B, T] exp(log_prob - old_log_prob), log-ratio clamped to +-20
    clipped: torch.Tensor  # [B, T] bool: PPO bound active (zero gradient)
    dual_clipped: torch.Tensor  # [B, T] bool: dual-clip cap active (zero gradient)


def clipped_surrogate(
    advantages: torch.Tensor, ratio: torch.Tensor, clip_ratio: float, clip_ratio_high: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate -A * clip(ratio, 1 - eps_low, 1 + eps_high) per token
    (eps_high defaults to eps_low): the losses and where the upper / lower bound is active
    (there the gradient is zero)."""
    eps_high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    low, high = 1.0 - clip_ratio, 1.0 + eps_high
    clip_high = (advantages > 0) & (ratio > high)
    clip_low = (advantages < 0) & (ratio < low)
    losses = -advantages * ratio
    losses = torch.where(clip_high, -advantages * high, losses)
    losses = torch.where(clip_low, -advantages * low, losses)
    return losses, clip_high, clip_low


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
    `mode` "gspo" clips one ratio per sequence (`gspo_token_losses`; no dual clip).
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


# ---------------------------------------------------------------------------- GSPO


def sequence_log_ratio(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """log s_i [B, 1]: the masked token mean of log pi - log pi_old (0 for an empty row)."""
    diff = log_prob.float() - old_log_prob.float()
    return masked_mean(diff, response_mask, dim=-1)[:, None]


def gspo_token_losses(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float,
    clip_ratio_high: float | None = None,
) -> ClippedTokens:
    """Per-token GSPO losses [B, T] (aggregate with seq-mean-token-mean for the paper's
    objective); `clip_ratio` is eps_low, `clip_ratio_high` eps_high (default eps_low).
    `ratio` holds s_i on every token; no dual clip (the paper has none)."""
    mask = response_mask.bool()
    adv = advantages.float()
    log_seq = sequence_log_ratio(log_prob, old_log_prob, mask)
    lp = log_prob.float()
    log_token = (log_seq.detach() + lp - lp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_token)  # s_i on every token, gradient through log pi(y_i,t)
    losses, clip_high, clip_low = clipped_surrogate(adv, ratio, clip_ratio, clip_ratio_high)
    none = torch.zeros_like(clip_high)
    return ClippedTokens(losses, ratio.detach(), (clip_high | clip_low) & mask, none)


def sequence_clipfrac(tokens: ClippedTokens, response_mask: torch.Tensor) -> float:
    """Fraction of sequences (with a valid token) whose ratio was clipped."""
    mask = response_mask.bool()
    rows = mask.any(dim=-1)
    clipped_rows = masked_sum(tokens.clipped.float(), mask, dim=-1) > 0
    return float(clipped_rows[rows].float().mean()) if rows.any() else 0.0
