"""What the clipped policy losses share: the log-ratio clamp and their per-token result."""

from __future__ import annotations

from typing import NamedTuple

import torch

LOG_RATIO_CLAMP = 20.0


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
