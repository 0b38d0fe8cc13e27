"""stage ray_dapo: what MindSpeed-RL's DAPO trainer does with the rl_config keys.

Its trainer has no reference model (the DAPO loss has no KL term), clips the ratio to
[1 - clip_ratio_low, 1 + clip_ratio_high] when ``clip_higher_enable`` (else ``clip_ratio`` both
ways, no dual clip), and averages the loss over the batch's tokens (``token_level_loss``) or
over sequences of token means. `dapo_rl` turns those keys into the algorithm settings the
loss reads, so the update code is the same for both stages; `dapo_problems` holds DAPO's
cross-field rules (MindSpeed-RL's ``validate_rl_args``) and the warnings for DAPO keys that
have no effect with stage ray_grpo.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mindrl.config.fates import is_default, warn_once
from mindrl.config.rl import AlgorithmConfig, RLConfig
from mindrl.config.rl_features import DapoConfig

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig

DAPO = "ray_dapo"
MINDSPEED_CLIP_RATIO_HIGH = 0.1  # MindSpeed-RL's rl_config default, read only by DAPO
_LOSS_KEYS = ("clip_higher_enable", "clip_ratio_low", "token_level_loss")
_FILTER_KEYS = (
    "filter_groups_enable",
    "filter_groups_metric",
    "filter_groups_max_batches",
    "filter_groups_train_batch_size",
)


def dapo_algorithm(alg: AlgorithmConfig, dapo: DapoConfig) -> AlgorithmConfig:
    """The algorithm settings DAPO's loss uses; warns for the keys it overrides."""
    asked = alg.init_kl_coef is not None or alg.use_kl_loss or alg.use_kl_in_reward
    if alg.kl.where != "off" and asked:  # not for MindSpeed-RL's default coefficient
        warn_once(
            "dapo.kl",
            f"rl_config: {alg.kl.describe()} has no effect with stage ray_dapo: MindSpeed-RL's "
            "DAPO trainer has no reference model and its loss no KL term",
        )
    if alg.loss_agg_mode != "token-mean":
        warn_once(
            "dapo.loss_agg_mode",
            f"rl_config.loss_agg_mode: {alg.loss_agg_mode} has no effect with stage ray_dapo: "
            "token_level_loss decides (true: token-mean, false: seq-mean-token-mean)",
        )
    if dapo.clip_higher_enable:
        low = dapo.clip_ratio_low
        high = MINDSPEED_CLIP_RATIO_HIGH if alg.clip_ratio_high is None else alg.clip_ratio_high
    else:
        low = high = alg.clip_ratio
    return dataclasses.replace(
        alg,
        clip_ratio=low,
        clip_ratio_high=high,
        clip_ratio_c=None,
        loss_agg_mode="token-mean" if dapo.token_level_loss else "seq-mean-token-mean",
        init_kl_coef=0.0,
        use_kl_in_reward=False,
        use_kl_loss=False,
    )


def dapo_rl(rl: RLConfig) -> RLConfig:
    """`rl` as stage ray_dapo reads it."""
    return dataclasses.replace(rl, algorithm=dapo_algorithm(rl.algorithm, rl.dapo))


def _unread_with_grpo(dapo: DapoConfig) -> None:
    fields = {f.name: f for f in dataclasses.fields(DapoConfig)}
    for name in (*_LOSS_KEYS, *_FILTER_KEYS):
        value = getattr(dapo, name)
        if not is_default(fields[name], value):
            warn_once(
                f"DapoConfig.{name}",
                f"rl_config.{name}: {value} has no effect with stage ray_grpo: MindSpeed-RL "
                "reads it in its DAPO trainer only (megatron_training.stage: ray_dapo)",
            )


def dapo_problems(run: RunConfig) -> list[str]:
    """DAPO's rules; with stage ray_grpo, the loss / filter keys are warned as unread."""
    dapo, alg, out = run.rl.dapo, run.rl.algorithm, []
    max_tokens = run.generate.sampling_config.max_tokens
    if dapo.overlong_buffer_enable:
        if not 0 < dapo.overlong_buffer < max_tokens:
            out.append(
                f"rl_config.overlong_buffer: {dapo.overlong_buffer} must be above 0 and below "
                f"sampling_config.max_tokens ({max_tokens})"
            )
        if dapo.rollout_max_tokens != max_tokens:
            out.append(
                f"rl_config.rollout_max_tokens: {dapo.rollout_max_tokens} differs from "
                f"generate_config.sampling_config.max_tokens ({max_tokens}); the overlong "
                "buffer is measured from it, so they must match (as MindSpeed-RL checks)"
            )
        if not run.rl.reward.rule_reward:
            warn_once(
                "dapo.overlong_rm",
                "rl_config.overlong_buffer_enable has no effect with a reward model: the "
                "penalty is added to rule rewards (rule_reward: true), as in MindSpeed-RL",
            )
    if run.actor.data.stage != DAPO:
        _unread_with_grpo(dapo)
        return out
    if alg.policy_loss != "vanilla":
        out.append(
            f"rl_config.policy_loss: {alg.policy_loss} with stage ray_dapo: DAPO's loss clips "
            "each token's ratio; use stage ray_grpo for it"
        )
    if dapo.clip_higher_enable and alg.clip_ratio > (alg.clip_ratio_high or 0.0):
        out.append(
            f"rl_config.clip_ratio_low: {dapo.clip_ratio_low} is above clip_ratio_high "
            f"({alg.clip_ratio_high})"
        )
    if dapo.filter_groups_enable:
        fns = run.rl.reward.verifier_function
        if not run.rl.reward.rule_reward or dapo.filter_groups_metric not in fns:
            out.append(
                f"rl_config.filter_groups_metric: {dapo.filter_groups_metric} must be one of "
                f"the rule verifiers (verifier_function {list(fns)}, rule_reward: true): "
                "dynamic sampling keeps groups whose scores from it differ"
            )
        gbs = run.actor.batch.global_batch_size
        if dapo.filter_groups_train_batch_size > gbs:
            out.append(
                f"rl_config.filter_groups_train_batch_size: {dapo.filter_groups_train_batch_size}"
                f" prompts is above global_batch_size ({gbs}): a step trains on at most one "
                "generation batch of prompts (as MindSpeed-RL's experience buffer holds)"
            )
    return out
