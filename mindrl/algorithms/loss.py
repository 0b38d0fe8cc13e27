"""The objectives the training workers backpropagate: the actor's GRPO objective (clipped pg
loss + KL loss - entropy bonus, one aggregation) and the PPO critic's value loss.

The critic's loss: squared error to the GAE returns, with the prediction clipped to
`cliprange_value` around the values seen at rollout (PPO2's value clipping, as MindSpeed-RL's
and verl's critics compute it):

    vf_loss = 0.5 * mean_t max((V_t - R_t)^2, (clip(V_t, v_t - c, v_t + c) - R_t)^2)

The mean runs over the response tokens of the whole mini-batch (`normalizer`: its token count
over every DP rank), so micro-batch and DP splits add up to the same loss.
"""

from __future__ import annotations

import torch

from mindrl.algorithms.aggregation import aggregate_loss
from mindrl.algorithms.kl import kl_penalty
from mindrl.algorithms.loss_config import GRPOLossConfig
from mindrl.algorithms.policy_loss import compute_policy_loss
from mindrl.algorithms.tis import RolloutCorrection, rollout_correction


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
    (needed with use_tis: the rollout correction's weights). `normalizer` is passed to `aggregate_loss` for global-batch means.
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
        lower, upper = cfg.rollout_is_bounds
        settings = RolloutCorrection(cfg.rollout_is_level, cfg.rollout_is_mode, upper, lower)
        correction = rollout_correction(old_log_prob, rollout_log_prob, mask, settings)
        weights = correction.weights
        metrics.update(correction.metrics)
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
        kl = kl_penalty(log_prob, ref_log_prob, cfg.kl_penalty)
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


def clipped_value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    normalizer: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) of one micro-batch; the loss is this micro-batch's share of the
    mini-batch mean."""
    mask = response_mask.float()
    # clamp keeps an unclipped prediction bit-identical (old + (v - old) may not be)
    clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_err = (vpreds - returns) ** 2
    clipped_err = (clipped - returns) ** 2
    loss = 0.5 * (torch.maximum(unclipped_err, clipped_err) * mask).sum() / max(normalizer, 1.0)
    tokens = mask.sum().clamp(min=1.0)
    metrics = {
        "critic/vf_loss": float(loss.detach()),
        "critic/vf_clipfrac": float(((clipped_err > unclipped_err).float() * mask).sum() / tokens),
        "critic/vpred_mean": float((vpreds.detach() * mask).sum() / tokens),
    }
    return loss, metrics
