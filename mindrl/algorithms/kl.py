"""Per-token KL estimators between the policy and a reference, from sampled-token log-probs.

With log r = log p_ref - log p_policy on tokens sampled from the policy (Schulman's notes):
k1 = -log r (unbiased, high variance, can be negative), k2 = 0.5 (log r)^2 (biased, >= 0),
k3 = r - 1 - log r (unbiased, >= 0; verl's `low_var_kl`, clamped to [-10, 10] there and here
so one wild token cannot dominate the loss).
"""

from __future__ import annotations

import torch

from mindrl.algorithms.names import KL_ALIASES, KL_TYPES

LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Elementwise KL estimate [B, T] (fp32); padding is the caller's mask to apply."""
    kind = KL_ALIASES.get(kl_type, kl_type)
    diff = log_prob.float() - ref_log_prob.float()  # = -log r
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "k3":
        log_r = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.exp(log_r) - log_r - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
    raise ValueError(f"unknown kl type {kl_type!r}; expected one of {KL_TYPES}")
