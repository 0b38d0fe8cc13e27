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
