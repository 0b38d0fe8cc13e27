"""`rl_config`: algorithm, rewards, resources, logging and loop knobs, grouped by concern."""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fields import spec
from mindrl.rewards.types import RewardParams  # cosine / repetition / soft_overlong knobs

# Names mirror mindrl.algorithms (kept here as literals so validation does not import torch;
# tests/unit/test_config_names.py checks they agree).
ADV_ESTIMATORS = (
    "group_norm",
    "grpo",
    "grpo_no_std",
    "dr_grpo",
    "rloo",
    "reinforce_plus_plus_baseline",
)
GROUP_ESTIMATORS = ADV_ESTIMATORS  # all of them compare samples within a prompt's group
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


@dataclass(frozen=True)
class ResourceSpec:
    """Devices for one role: NPUs on Ascend, GPUs on NVIDIA, CPU worker slots on a CPU box."""

    num_npus: int = spec(1, ge=1, aliases=("num_gpus", "num_devices"))


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: str = spec("group_norm", choices=ADV_ESTIMATORS)
    n_samples_per_prompt: int = spec(8, ge=1)
    mini_batch_size: int = spec(0, ge=0, help="samples per optimizer step; 0 = the whole batch")
    epochs: int = spec(1, ge=1, help="passes over each RL batch")
    recompute_old_log_prob: str = spec(
        "auto",
        choices=("auto", "always"),
        help="auto: skip the old-policy forward pass when each RL batch gets one optimizer "
        "step (the update's own detached log-probs are the same numbers)",
    )
    shuffle_minibatch: bool = spec(False, aliases=("shuffle_mini_batch",))
    clip_ratio: float = spec(0.2, gt=0.0, le=1.0)
    clip_ratio_high: float | None = spec(
        None, gt=0.0, le=1.0, aliases=("epsilon_high",), help="DAPO clip-higher upper bound"
    )
    clip_ratio_c: float = spec(3.0, gt=1.0, help="dual-clip bound for negative advantages")
    loss_agg_mode: str = spec("token-mean", choices=LOSS_AGG_MODES)
    kl_penalty: str = spec("low_var_kl", choices=KL_TYPES, help="KL estimator")
    kl_ctrl_type: str = spec("fixed", choices=("fixed", "adaptive"))
    init_kl_coef: float = spec(0.0, ge=0.0, help="KL-in-reward coefficient (0 disables)")
    kl_target: float = spec(0.1, gt=0.0)
    kl_horizon: float = spec(10000.0, gt=0.0)
    use_kl_loss: bool = False
    kl_loss_coef: float = spec(0.001, ge=0.0)
    entropy_coeff: float = spec(0.0, ge=0.0)
    gamma: float = spec(1.0, ge=0.0, le=1.0)
    lam: float = spec(0.95, ge=0.0, le=1.0)
    max_prompt_length: int = spec(512, ge=1)
    dynamic_sampling: bool = spec(False, help="DAPO: drop groups whose rewards all tie")
    max_resample_times: int = spec(3, ge=0)
    overlong_filter: bool = spec(False, help="mask responses truncated at max_tokens")
    use_tis: bool = spec(False, help="truncated importance sampling rollout -> train")
    tis_cap: float = spec(2.0, gt=0.0)


@dataclass(frozen=True)
class RewardConfig:
    rule_reward: bool = True
    verifier_function: tuple[str, ...] = ("base_acc",)
    verifier_weight: tuple[float, ...] = (1.0,)
    verifier_parallel: int = spec(1, ge=1, help="processes scoring rule rewards")
    verifier_timeout: float = spec(30.0, gt=0.0, help="seconds per sample")
    verifier_files: tuple[str, ...] = spec((), help="python files that register custom verifiers")


@dataclass(frozen=True)
class ResourceConfig:
    actor_resource: ResourceSpec = ResourceSpec()
    reference_resource: ResourceSpec | None = None
    reward_resource: ResourceSpec | None = None
    colocate_actor_ref: bool = False
    colocate_all_models: bool = False
    use_integrated_worker: bool = spec(True, help="actor + rollout in one worker (hybrid engine)")
    num_cpus_for_local_task: float = spec(1.0, gt=0.0)
    num_cpus_for_placement_group: int = spec(1, ge=1, help="CPUs per device bundle")
    blocking: bool = True
    guarantee_order: bool = False


@dataclass(frozen=True)
class LoggingConfig:
    use_tensorboard: bool = False
    use_wandb: bool = False
    wandb_project: str = ""
    wandb_exp_name: str = ""
    wandb_save_dir: str = ""
    log_completions: int = spec(0, ge=0, help="completions written per step to completions.jsonl")


@dataclass(frozen=True)
class LoopConfig:
    test_freq: int = spec(0, ge=0, help="validate every N steps; 0 disables")
    val_before_train: bool = False
    val_only: bool = False
    val_data_path: str | None = None


RL_GROUPS: dict[str, type] = {
    "algorithm": AlgorithmConfig,
    "reward": RewardConfig,
    "reward_params": RewardParams,
    "resources": ResourceConfig,
    "logging": LoggingConfig,
    "loop": LoopConfig,
}


@dataclass(frozen=True)
class RLConfig:
    algorithm: AlgorithmConfig
    reward: RewardConfig
    reward_params: RewardParams
    resources: ResourceConfig
    logging: LoggingConfig
    loop: LoopConfig
