"""Names of the algorithm variants a config can select: the one list config validation (which
must not import torch) and the implementations (which dispatch on them) both read.

Imports nothing, so `import mindrl.algorithms.names` stays torch-free (the package
`__init__` loads its other modules lazily).
"""

from __future__ import annotations

# `rl_config.adv_estimator`: implemented estimators, then aliases (MindSpeed-RL / verl names).
ADV_ESTIMATORS: tuple[str, ...] = (
    "group_norm",
    "grpo_no_std",
    "rloo",
    "reinforce_plus_plus_baseline",
    "reinforce_plus_plus",
)
# Estimators that read a critic's values (stage ray_ppo): the trainer's advantage step
# calls them with the values, `compute_advantages` (samples and rewards only) refuses them.
CRITIC_ESTIMATORS: tuple[str, ...] = ("gae",)
ADV_ALIASES: dict[str, str] = {"grpo": "group_norm", "dr_grpo": "grpo_no_std"}
ADV_ESTIMATOR_NAMES: tuple[str, ...] = ADV_ESTIMATORS + CRITIC_ESTIMATORS + tuple(ADV_ALIASES)
# Estimators that compare the samples of one prompt's group (they need n_samples >= 2).
GROUP_ESTIMATORS: tuple[str, ...] = tuple(
    n for n in ADV_ESTIMATOR_NAMES if n not in ("reinforce_plus_plus", "gae")
)
# Estimators of token-level returns: they read rl_config.gamma.
RETURN_ESTIMATORS: tuple[str, ...] = ("reinforce_plus_plus", "gae")

# `rl_config.kl_penalty` / the KL loss: Schulman's k1 / k2 / k3, |log r|, and verl's names.
KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3", "abs", "mse", "kl", "low_var_kl")
KL_ALIASES: dict[str, str] = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}

# `rl_config.kl_ctrl_type`: the KL-in-reward coefficient controller.
KL_CTRL_TYPES: tuple[str, ...] = ("fixed", "adaptive")

# `rl_config.loss_agg_mode`: how per-token losses reduce to one scalar.
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

# `rl_config.policy_loss` (verl's `policy_loss.loss_mode`): PPO's per-token clipped ratio, or
# GSPO's per-sequence one.
POLICY_LOSS_MODES: tuple[str, ...] = ("vanilla", "gspo")

# `rl_config.rollout_is_level` (verl's names): one importance weight pi_old / pi_rollout per
# token, per sequence (the product of its token ratios), or per sequence as the geometric mean.
ROLLOUT_IS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")
# `rl_config.rollout_is_mode` (verl's names): clip the weight at the upper threshold, or drop
# the tokens / sequences whose weight is outside [lower, upper] (rejection sampling).
ROLLOUT_IS_MODES: tuple[str, ...] = ("truncate", "mask")

# `megatron_training.dpo_loss_type` (MindSpeed-LLM's `--dpo-loss-type` choices, which are TRL's
# names): sigmoid (DPO), hinge (SLiC), ipo (IPO, on length-averaged log-probs).
DPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "hinge", "ipo")
# Losses that read each sequence's mean token log-prob instead of its sum (TRL and MindSpeed-LLM
# both average for IPO).
LENGTH_AVERAGED_DPO_LOSSES: tuple[str, ...] = ("ipo",)
