"""Advantages on the driver: the optional overlong filter and KL-in-reward penalty, then
the configured estimator (GAE with the critic's values: also the critic's returns). Pure
tensor math over the batch; the batch is not changed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mindrl.algorithms.kl import FixedKLController as KLController
from mindrl.algorithms.names import RETURN_ESTIMATORS
from mindrl.config.distillation import DistillationConfig
from mindrl.config.rl import AlgorithmConfig
from mindrl.data.batch import SampleBatch


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor  # [B, S-1]
    response_mask: torch.Tensor  # the mask the loss must use (overlong responses dropped)
    metrics: dict[str, float]
    returns: torch.Tensor | None = None  # GAE: the critic's regression targets [B, S-1]


def uses_kl_in_reward(alg: AlgorithmConfig) -> bool:
    return alg.kl.where == "reward"


def compute_step_advantages(
    batch: SampleBatch,
    scores: torch.Tensor,
    alg: AlgorithmConfig,
    kl_ctrl: KLController,
    old_lp: torch.Tensor | None = None,
    ref_lp: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    *,
    teacher: torch.Tensor | None = None,
    distillation: DistillationConfig | None = None,
) -> Advantages:
    """Advantages of `batch` from its `scores`; the KL controller adapts to this step's KL
    when the penalty goes into the reward. With on-policy distillation (`distillation.use_opd`)
    the advantage is the per-token reverse KL of the student (`old_lp`) against the
    `teacher`, plus the estimator's advantage of the scores with `use_task_rewards`."""
    from mindrl.algorithms import compute_advantages, kl_penalized_rewards, overlong_filter

    mask = batch.response_mask
    if alg.overlong_filter:
        mask = overlong_filter(mask, batch.meta["finish_reason"])
    metrics: dict[str, float] = {}
    rewards = scores
    if uses_kl_in_reward(alg) and ref_lp is not None:
        if old_lp is None:
            raise ValueError("a KL-in-reward penalty needs the recomputed old log-probs")
        penalized = kl_penalized_rewards(
            scores, old_lp, ref_lp, mask, kl_ctrl.value, alg.kl_penalty
        )
        # the group estimators compare sequence totals; REINFORCE++ discounts token rewards
        token_level = alg.adv_estimator in RETURN_ESTIMATORS
        rewards = penalized.token_rewards if token_level else penalized.seq_rewards
        metrics["actor/reward_kl_penalty"] = penalized.mean_kl
        metrics["actor/reward_kl_penalty_coeff"] = float(kl_ctrl.value)
        kl_ctrl.update(penalized.mean_kl, batch.size)
    if distillation is not None and distillation.use_opd:
        return _distilled(rewards, alg, mask, metrics, old_lp, teacher, distillation)
    if alg.adv_estimator == "gae":
        return _gae(rewards, values, mask, alg, metrics, penalized_tokens=rewards is not scores)
    adv = compute_advantages(
        alg.adv_estimator, rewards, alg.n_samples_per_prompt, mask, gamma=alg.gamma
    )
    return Advantages(adv, mask, metrics)


def _gae(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    mask: torch.Tensor,
    alg: AlgorithmConfig,
    metrics: dict[str, float],
    *,
    penalized_tokens: bool,
) -> Advantages:
    """GAE over the critic's values; advantages whitened over the batch's response tokens
    (as MindSpeed-RL's and verl's PPO), returns left raw for the critic."""
    from mindrl.algorithms import gae_advantages, outcome_token_rewards
    from mindrl.algorithms.aggregation import whiten

    if values is None:
        raise ValueError("adv_estimator gae needs the critic's values")
    token_rewards = rewards if penalized_tokens else outcome_token_rewards(rewards, mask)
    adv, returns = gae_advantages(token_rewards, values, mask, gamma=alg.gamma, lam=alg.lam)
    valid = mask.bool()
    metrics["critic/values_mean"] = float(values[valid].mean()) if valid.any() else 0.0
    metrics["critic/returns_mean"] = float(returns[valid].mean()) if valid.any() else 0.0
    return Advantages(whiten(adv, valid), mask, metrics, returns)


def _distilled(
    rewards: torch.Tensor,
    alg: AlgorithmConfig,
    mask: torch.Tensor,
    metrics: dict[str, float],
    student_lp: torch.Tensor | None,
    teacher_lp: torch.Tensor | None,
    cfg: DistillationConfig,
) -> Advantages:
    """On-policy distillation's token advantages; the task's (the configured estimator over
    the rewards) added with `use_task_rewards`."""
    from mindrl.algorithms import compute_advantages, distillation_advantages

    if student_lp is None or teacher_lp is None:
        raise ValueError("on-policy distillation needs the student's and the teacher's log-probs")
    task = None
    if cfg.use_task_rewards:
        task = compute_advantages(
            alg.adv_estimator, rewards, alg.n_samples_per_prompt, mask, gamma=alg.gamma
        )
    out = distillation_advantages(student_lp, teacher_lp, mask, cfg.opd_kl_coef, task)
    return Advantages(out.values, mask, {**metrics, **out.metrics})
