"""stage ray_ppo: PPO with a critic, as MindSpeed-RL's PPO trainer configures it.

The critic is its own megatron role (`critic_config`, merged over `megatron_training` like
the actor's; `rl_config.critic_resource` devices); advantages come from GAE (`adv_estimator:
gae`, `gamma`, `lam`) over the critic's values, and the critic regresses on the returns with
value clipping (`cliprange_value`). `ppo_problems` holds the cross-field rules and warns the
PPO-only keys set under another stage.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mindrl.config.fates import is_default, warn_once
from mindrl.config.rl import AlgorithmConfig

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig

PPO = "ray_ppo"
GAE = "gae"
_CRITIC_ONLY = ("cliprange_value", "lam")


def ppo_problems(run: RunConfig) -> list[str]:
    """PPO's rules; with another stage, critic-only keys are warned as unread."""
    alg, out = run.rl.algorithm, []
    if run.actor.data.stage != PPO:
        fields = {f.name: f for f in dataclasses.fields(AlgorithmConfig)}
        for name in _CRITIC_ONLY:
            if not is_default(fields[name], getattr(alg, name)):
                warn_once(
                    f"ppo.{name}",
                    f"rl_config.{name}: {getattr(alg, name)} has no effect with stage "
                    f"{run.actor.data.stage}: only PPO's critic reads it (stage: ray_ppo)",
                )
        if alg.adv_estimator == GAE:
            out.append(
                "rl_config.adv_estimator: gae needs a critic's values: set "
                "megatron_training.stage: ray_ppo with a critic_config section"
            )
        return out
    if run.critic is None:
        out.append("critic_config: required with stage ray_ppo (the value model's section)")
    if alg.adv_estimator != GAE:
        out.append(
            f"rl_config.adv_estimator: {alg.adv_estimator} with stage ray_ppo: PPO's critic "
            "is trained for GAE; use adv_estimator: gae (or stage ray_grpo)"
        )
    if alg.cliprange_value <= 0:
        out.append(f"rl_config.cliprange_value: {alg.cliprange_value} must be above 0")
    if run.critic is not None and run.critic.ckpt.save not in (None, run.actor.ckpt.save):
        warn_once(
            "ppo.critic_save",
            f"critic_config.save: {run.critic.ckpt.save} has no effect: the critic is saved "
            "with the actor's step, in ACTOR_SAVE/iter_N/critic/ (one folder per step, resumed "
            "together)",
        )
    if run.critic is not None and run.critic.optim.train_iters != run.actor.optim.train_iters:
        out.append(
            f"critic_config.train_iters: {run.critic.optim.train_iters} differs from the "
            f"actor's ({run.actor.optim.train_iters}); both train once per RL step"
        )
    return out
