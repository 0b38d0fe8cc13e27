"""mindrl.algorithms: pure tensor math of GRPO (torch only; no Ray, megatron or vLLM).

All functions take [B, T] tensors with a 0/1 response mask and compute in fp32.
"""

from mindrl.algorithms.advantages import (
    ADV_ALIASES,
    ADV_ESTIMATORS,
    compute_advantages,
    group_norm_scores,
    grpo_no_std_scores,
    rloo_scores,
    sequence_scores,
    whiten,
)
from mindrl.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss, masked_mean, masked_sum
from mindrl.algorithms.dapo import (
    DynamicSampler,
    DynamicSamplingResult,
    accumulate_groups,
    group_sample_indices,
    informative_groups,
    overlong_filter,
    truncated_responses,
)
from mindrl.algorithms.kl import KL_TYPES, kl_penalty
from mindrl.algorithms.kl_control import (
    KL_CTRL_TYPES,
    AdaptiveKLController,
    FixedKLController,
    KLControlConfig,
    KLPenalizedRewards,
    kl_penalized_rewards,
    make_kl_controller,
)
from mindrl.algorithms.logprobs import entropy_from_logits, log_probs_from_logits
from mindrl.algorithms.loss import GRPOLossConfig, grpo_loss
from mindrl.algorithms.policy_loss import (
    ClippedTokens,
    PolicyLoss,
    compute_policy_loss,
    ppo_clip_token_losses,
)
from mindrl.algorithms.tis import rollout_mismatch_metrics, tis_weights

__all__ = [
    "ADV_ALIASES",
    "ADV_ESTIMATORS",
    "KL_CTRL_TYPES",
    "KL_TYPES",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "ClippedTokens",
    "DynamicSampler",
    "DynamicSamplingResult",
    "FixedKLController",
    "GRPOLossConfig",
    "KLControlConfig",
    "KLPenalizedRewards",
    "PolicyLoss",
    "accumulate_groups",
    "aggregate_loss",
    "compute_advantages",
    "compute_policy_loss",
    "entropy_from_logits",
    "group_norm_scores",
    "group_sample_indices",
    "grpo_loss",
    "grpo_no_std_scores",
    "informative_groups",
    "kl_penalized_rewards",
    "kl_penalty",
    "log_probs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "overlong_filter",
    "ppo_clip_token_losses",
    "rloo_scores",
    "rollout_mismatch_metrics",
    "sequence_scores",
    "tis_weights",
    "truncated_responses",
    "whiten",
]
