"""The actor's GRPO objective: clipped pg loss + KL loss - entropy bonus, one aggregation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mindrl.algorithms.aggregation import aggregate_loss, masked_mean
from mindrl.algorithms.kl import kl_penalty
from mindrl.algorithms.names import KL_TYPES, LOSS_AGG_MODES, POLICY_LOSS_MODES
from mindrl.algorithms.policy_loss import compute_policy_loss
from mindrl.algorithms.tis import tis_weights


@dataclass(frozen=True)
class GRPOLossConfig:
    """Loss knobs (rl_config / actor names as in MindSpeed-RL and verl).

    clip_ratio is the low bound and the high one unless clip_ratio_high (DAPO/ms-swift
    `epsilon_high`) is set; clip_ratio_c is the dual-clip cap for negative advantages (None
    disables it). With use_tis, each token's pg loss is weighted by
    min(pi_old / pi_rollout, tis_cap).
    """

    clip_ratio: float = 0.2
    clip_ratio_high: float | None = None
    clip_ratio_c: float | None = 3.0
    loss_agg_mode: str = "token-mean"
    loss_agg_horizon: int | None = None
    policy_loss: str = "vanilla"
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    use_tis: bool = False
    tis_cap: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio < 1.0:
            raise ValueError(f"clip_ratio must be in [0, 1), got {self.clip_ratio}")
        if self.clip_ratio_high is not None and self.clip_ratio_high < 0:
            raise ValueError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.policy_loss not in POLICY_LOSS_MODES:
            raise ValueError(f"policy_loss {self.policy_loss!r} not in {POLICY_LOSS_MODES}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode {self.loss_agg_mode!r} not in {LOSS_AGG_MODES}")
        if self.loss_agg_horizon is not None and self.loss_agg_horizon <= 0:
            raise ValueError(f"loss_agg_horizon must be > 0, got {self.loss_agg_horizon}")
        if self.kl_loss_type not in KL_TYPES:
            raise ValueError(f"kl_loss_type {self.kl_loss_type!r} not in {KL_TYPES}")
        if self.kl_loss_coef < 0 or self.entropy_coeff < 0:
            raise ValueError("kl_loss_coef and entropy_coeff must be >= 0")
        if self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0, got {self.tis_cap}")


def grpo_loss(
    cfg: GRPOLossConfig,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    ref_log_prob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    rollout_log_prob: torch.Tensor | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss to backpropagate, and float metrics.

    All [B, T]: `log_prob` (current policy, with grad), `old_log_prob`, `advantages`,
    `response_mask`; optional `ref_log_prob` (needed with use_kl_loss; reported otherwise),
    `entropy` (per token, with grad; needed when entropy_coeff > 0), `rollout_log_prob`
    (needed with use_tis). `normalizer` is passed to `aggregate_loss` for global-batch means.
    """
    mask = response_mask.bool()

    def reduce(values: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(
            values, mask, cfg.loss_agg_mode, horizon=cfg.loss_agg_horizon, normalizer=normalizer
        )

    metrics: dict[str, float] = {}
    weights = None
    if cfg.use_tis:
        if rollout_log_prob is None:
            raise ValueError("use_tis needs rollout_log_prob")
        weights = tis_weights(old_log_prob, rollout_log_prob, mask, cfg.tis_cap)
        metrics["actor/tis_weight_mean"] = float(masked_mean(weights, mask))
        metrics["actor/tis_clipfrac"] = float(masked_mean((weights >= cfg.tis_cap).float(), mask))
    pg = compute_policy_loss(
        log_prob,
        old_log_prob,
        advantages,
        mask,
        cfg.clip_ratio,
        cfg.clip_ratio_high,
        cfg.clip_ratio_c,
        cfg.loss_agg_mode,
        token_weights=weights,
        horizon=cfg.loss_agg_horizon,
        normalizer=normalizer,
        mode=cfg.policy_loss,
    )
    loss = pg.loss
    metrics["actor/pg_loss"] = float(pg.loss.detach())
    metrics["actor/pg_clipfrac"] = pg.pg_clipfrac
    metrics["actor/pg_clipfrac_lower"] = pg.pg_clipfrac_lower
    metrics["actor/ppo_kl"] = pg.ppo_kl

    if cfg.use_kl_loss and ref_log_prob is None:
        raise ValueError("use_kl_loss needs ref_log_prob")
    if ref_log_prob is not None:
        kl = kl_penalty(log_prob, ref_log_prob, cfg.kl_loss_type)
        kl_loss = reduce(kl)
        metrics["actor/kl_loss"] = float(kl_loss.detach())
        if cfg.use_kl_loss:
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_coef"] = cfg.kl_loss_coef

    if cfg.entropy_coeff > 0 and entropy is None:
        raise ValueError("entropy_coeff > 0 needs the per-token entropy")
    if entropy is not None:
        ent = reduce(entropy.float())
        metrics["actor/entropy"] = float(ent.detach())
        if cfg.entropy_coeff > 0:
            loss = loss - cfg.entropy_coeff * ent
    return loss, metrics
