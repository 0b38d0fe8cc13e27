"""KL between the policy and a reference: the per-token estimators, and KL as a reward
penalty (`use_kl_in_reward`) with a fixed or adaptive coefficient.

With log r = log p_ref - log p_policy on tokens sampled from the policy (Schulman's notes):
k1 = -log r (unbiased, high variance, can be negative), k2 = 0.5 (log r)^2 (biased, >= 0),
k3 = r - 1 - log r (unbiased, >= 0; verl's `low_var_kl`, clamped to [-10, 10] there and here
so one wild token cannot dominate the loss).

The adaptive controller is the PPO one (Ziegler et al. 2019): it nudges the coefficient so the
measured KL tracks `target_kl`, by at most 20% per `horizon` samples. Controllers hold the
only mutable state in this package; `state_dict` lets a resumed run continue the same beta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from mindrl.algorithms.aggregation import LOG_RATIO_CLAMP, masked_mean, masked_sum
from mindrl.algorithms.names import KL_ALIASES, KL_CTRL_TYPES, KL_TYPES
from mindrl.algorithms.returns import outcome_token_rewards

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


@dataclass(frozen=True)
class KLControlConfig:
    """`algorithm.kl_ctrl`-style knobs: type, initial coefficient, adaptive target."""

    type: str = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000

    def __post_init__(self) -> None:
        if self.type not in KL_CTRL_TYPES:
            raise ValueError(f"kl_ctrl.type {self.type!r} not in {KL_CTRL_TYPES}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_ctrl.kl_coef must be >= 0, got {self.kl_coef}")
        if self.type == "adaptive" and (self.target_kl <= 0 or self.horizon <= 0):
            raise ValueError("adaptive kl_ctrl needs target_kl > 0 and horizon > 0")


class FixedKLController:
    """Constant coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """beta <- beta * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        super().__init__(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move beta after seeing `n_steps` samples whose mean KL was `current_kl`."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(cfg: KLControlConfig) -> FixedKLController:
    """Controller for `cfg.type`."""
    if cfg.type == "adaptive":
        return AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.horizon)
    return FixedKLController(cfg.kl_coef)


class KLPenalizedRewards(NamedTuple):
    token_rewards: torch.Tensor  # [B, T]: score on the last valid token, minus coef * kl
    seq_rewards: torch.Tensor  # [B]: score - coef * sum of token kl (kept for empty rows)
    mean_kl: float  # mean over non-empty sequences of each one's token-mean kl


def kl_penalized_rewards(
    scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_type: str = "k1",
) -> KLPenalizedRewards:
    """Subtract `kl_coef * kl` from the rewards, per token and per sequence.

    `seq_rewards` is what the group advantages should see: a zero-length response keeps its
    score there (it still shifts its group's mean) though it has no token to carry it.
    `mean_kl` is the value to feed `controller.update(mean_kl, n_steps=batch_size)`.
    """
    valid = response_mask.bool()
    kld = kl_penalty(log_prob.detach(), ref_log_prob.detach(), kl_type)  # a reward: no grad
    kld = torch.where(valid, kld, kld.new_zeros(()))
    scores = scores.float().to(kld.device)
    has_tokens = valid.any(dim=-1)
    token_rewards = outcome_token_rewards(scores, valid) - kl_coef * kld
    seq_rewards = scores - kl_coef * masked_sum(kld, valid, dim=-1)
    per_seq_kl = masked_mean(kld, valid, dim=-1)
    mean_kl = float(masked_mean(per_seq_kl, has_tokens))
    return KLPenalizedRewards(token_rewards, seq_rewards, mean_kl)
