"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one importance ratio per
sequence, clipped per sequence.

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

import torch

from mindrl.algorithms.aggregation import masked_mean, masked_sum
from mindrl.algorithms.ratios import LOG_RATIO_CLAMP, ClippedTokens, clipped_surrogate


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
