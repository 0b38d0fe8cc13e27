"""mindrl.algorithms: pure tensor math of GRPO (torch only; no Ray, megatron or vLLM).

All functions take [B, T] tensors with a 0/1 response mask and compute in fp32.

The package loads its modules on first attribute access, so config validation can import
`mindrl.algorithms.names` (the selectable variant names) without importing torch;
`from mindrl.algorithms import compute_advantages` works as with eager imports.
"""

from __future__ import annotations

import importlib
from typing import Any

# module -> the public names it defines
_EXPORTS: dict[str, tuple[str, ...]] = {
    "names": (
        "ADV_ALIASES",
        "ADV_ESTIMATORS",
        "ADV_ESTIMATOR_NAMES",
        "CRITIC_ESTIMATORS",
        "DPO_LOSS_TYPES",
        "GROUP_ESTIMATORS",
        "KL_ALIASES",
        "LENGTH_AVERAGED_DPO_LOSSES",
        "KL_CTRL_TYPES",
        "KL_TYPES",
        "LOSS_AGG_MODES",
        "POLICY_LOSS_MODES",
        "RETURN_ESTIMATORS",
    ),
    "advantages": (
        "compute_advantages",
        "group_norm_scores",
        "grpo_no_std_scores",
        "rloo_scores",
        "sequence_scores",
    ),
    "aggregation": ("aggregate_loss", "masked_mean", "masked_sum", "whiten"),
    "dpo": (
        "DPOLoss",
        "dpo_loss",
        "pair_losses",
        "pair_preference_accuracy",
        "sequence_log_probs",
    ),
    "dpo_config": ("DPOLossConfig",),
    "dapo": (
        "GroupFilter",
        "group_sample_indices",
        "informative_groups",
        "overlong_buffer_penalty",
        "overlong_filter",
        "truncated_responses",
    ),
    "distillation": (
        "DistillationAdvantages",
        "distillation_advantages",
        "reverse_kl_tokens",
    ),
    "kl": (
        "AdaptiveKLController",
        "FixedKLController",
        "KLControlConfig",
        "KLPenalizedRewards",
        "kl_penalized_rewards",
        "kl_penalty",
        "make_kl_controller",
    ),
    "logprobs": ("entropy_from_logits", "log_probs_from_logits"),
    "loss": ("grpo_loss",),
    "loss_config": ("GRPOLossConfig",),
    "policy_loss": (
        "ClippedTokens",
        "PolicyLoss",
        "compute_policy_loss",
        "gspo_token_losses",
        "ppo_clip_token_losses",
        "sequence_clipfrac",
        "sequence_log_ratio",
    ),
    "returns": (
        "discounted_returns",
        "gae_advantages",
        "outcome_token_rewards",
        "reinforce_plus_plus_advantages",
    ),
    "tis": (
        "CorrectionWeights",
        "RolloutCorrection",
        "level_log_weights",
        "rollout_correction",
        "rollout_mismatch_metrics",
        "tis_weights",
    ),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """Import the defining module on first use of one of its public names."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
