"""Advantages on the driver: the optional overlong filter and KL-in-reward penalty, then
the configured estimator. Pure tensor math over the batch; the batch is not changed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mindrl.algorithms.kl_control import FixedKLController as KLController
from mindrl.algorithms.names import RETURN_ESTIMATORS
from mindrl.config.rl import AlgorithmConfig
from mindrl.data.batch import SampleBatch


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor  # [B, S-1]
    response_mask: torch.Tensor  # the mask the loss must use (overlong responses dropped)
    metrics: dict[str, float]


def uses_kl_in_reward(alg: AlgorithmConfig) -> bool:
    return alg.kl.where == "reward"


def compute_step_advantages(
    batch: SampleBatch,
    scores: torch.Tensor,
    alg: AlgorithmConfig,
    kl_ctrl: KLController,
    old_lp: torch.Tensor | None = None,
    ref_lp: torch.Tensor | None = None,
) -> Advantages:
    """Advantages of `batch` from its `scores`; the KL controller adapts to this step's KL
    when the penalty goes into the reward."""
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
    values = compute_advantages(
        alg.adv_estimator, rewards, alg.n_samples_per_prompt, mask, gamma=alg.gamma
    )
    return Advantages(values, mask, metrics)
