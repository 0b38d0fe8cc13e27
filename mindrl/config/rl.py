"""`rl_config`: algorithm, rewards, resources, logging and loop knobs, grouped by concern."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from mindrl.algorithms.loss_config import GRPOLossConfig
from mindrl.algorithms.names import ADV_ESTIMATOR_NAMES, KL_CTRL_TYPES
from mindrl.config.distillation import DistillationConfig
from mindrl.config.fates import honoured, no_effect, refused
from mindrl.config.fields import spec
from mindrl.config.rl_features import (
    DapoConfig,
    MicroBatchingConfig,
    MultimodalConfig,
    RolloutModeConfig,
    TransferConfig,
)
from mindrl.rewards.types import RewardParams  # cosine / repetition / soft_overlong knobs

# The floor of verifier_memory_mb: below it a verifier worker cannot even load its imports
# (more of them when the trainer's imports reach it), so every call would fail.
MIN_VERIFIER_MEMORY_MB = 256


@dataclass(frozen=True)
class ResourceSpec:
    """Devices for one role: NPUs on Ascend, GPUs on NVIDIA, CPU worker slots on a CPU box."""

    num_npus: int = spec(1, ge=1, aliases=("num_gpus", "num_devices"))


DEFAULT_INIT_KL_COEF = 0.01  # MindSpeed-RL's rl_config default


@dataclass(frozen=True)
class KLPlacement:
    """`where` is "loss", "reward" or "off"; `estimator` is the kl_penalty name."""

    where: str
    coef: float
    estimator: str

    def describe(self) -> str:
        if self.where == "off":
            return "KL: off"
        ctrl = "" if self.where == "loss" else " (kl_ctrl_type controls it)"
        return f"KL: {self.where}, coef {self.coef:g}, estimator {self.estimator}{ctrl}"


ROLE_DEVICES = honoured(via="RoleConfig.num_devices")


@dataclass(frozen=True)
class AlgorithmConfig(GRPOLossConfig):
    """rl_config's algorithm keys; the loss knobs (and their ranges) are `GRPOLossConfig`'s,
    inherited, so each is defined once. The loss reads `loss_config(...)`, not this."""

    adv_estimator: str = spec("group_norm", choices=ADV_ESTIMATOR_NAMES)
    n_samples_per_prompt: int = spec(8, ge=1)
    mini_batch_size: int = spec(
        0,
        ge=0,
        help="per optimizer step, counted in `mini_batch_size_unit` (MindSpeed-RL 2.x: prompts, "
        "each with its n_samples_per_prompt samples); 0 = the whole batch",
    )
    mini_batch_size_unit: str = spec(
        "prompts",
        choices=("prompts", "samples"),
        help="how mini_batch_size counts: prompts (MindSpeed-RL 2.x, the default) or samples "
        "(MindSpeed-RL 1.x and the seed docs: 'usually gbs x n_samples_per_prompt')",
    )
    epochs: int = spec(1, ge=1, help="passes over each RL batch")
    recompute_old_log_prob: str = spec(
        "auto",
        choices=("auto", "always", "in_update"),
        help="auto: skip the old-policy forward pass when each RL batch gets one optimizer "
        "step (the update's own detached log-probs are the same numbers); in_update (with "
        "several optimizer steps, epochs 1): the update computes the old log-probs of all "
        "but its first mini-batch before its first step, and the first takes its own "
        "(one pass fewer over the first mini-batch, one call fewer; mindrl's own)",
    )
    shuffle_minibatch: bool = spec(False, aliases=("shuffle_mini_batch",))
    kl_ctrl_type: str = spec("fixed", choices=KL_CTRL_TYPES)
    init_kl_coef: float | None = spec(
        None,
        ge=0.0,
        help="MindSpeed-RL's KL weight: the KL-loss coefficient in GRPO, the reward penalty's "
        "with use_kl_in_reward (unset: 0.01, MindSpeed-RL's default; 0 turns KL off)",
    )
    use_kl_in_reward: bool = spec(
        False, help="KL as a penalty in the reward (init_kl_coef, kl_ctrl_type) instead of a loss"
    )
    kl_target: float = spec(0.1, gt=0.0)
    kl_horizon: float = spec(10000.0, gt=0.0)
    gamma: float = spec(
        1.0,
        ge=0.0,
        le=1.0,
        help="discount of token returns: read by adv_estimator reinforce_plus_plus and gae; "
        "the group estimators score whole sequences",
    )
    lam: float = spec(
        0.95, ge=0.0, le=1.0, help="GAE's lambda (stage ray_ppo; warned as unread elsewhere)"
    )
    max_prompt_length: int = spec(
        512, ge=1, help="longer prompts of the store are left out of training, as in MindSpeed-RL"
    )
    dynamic_sampling: bool = spec(
        False,
        help="DAPO: drop groups whose rewards all tie",
        fate=refused(
            "verl-style dynamic sampling under this name: not built; DAPO's dynamic sampling is "
            "MindSpeed-RL's filter_groups_enable (filter_groups_metric, _max_batches, "
            "_train_batch_size) with stage: ray_dapo"
        ),
    )
    max_resample_times: int = spec(
        3,
        ge=0,
        fate=no_effect("only dynamic_sampling reads it; DAPO's is filter_groups_max_batches"),
    )
    cliprange_value: float = spec(
        0.5,
        help="the critic's value clip around its rollout values (stage ray_ppo; warned as "
        "unread elsewhere)",
    )
    advantage_whiten: bool = spec(
        True, fate=no_effect("not read by MindSpeed-RL's trainers either")
    )
    beta: float = spec(
        0.1, fate=no_effect("not read by MindSpeed-RL's GRPO / DAPO / PPO losses either")
    )
    num_samples_per_step: int = spec(1, fate=no_effect("not read by MindSpeed-RL either"))
    overlong_filter: bool = spec(False, help="mask responses truncated at max_tokens")
    # verl's rollout-correction keys beyond the built ones (GRPOLossConfig's rollout_is_*)
    rollout_is_veto_threshold: float | None = spec(
        None,
        fate=refused(
            "verl's veto (a sequence dropped for one token whose ratio is below it) is not "
            "built; rollout_is_mode: mask drops the tokens or sequences whose weight is outside "
            "[rollout_is_threshold_lower, rollout_is_threshold]"
        ),
    )
    rollout_is_batch_normalize: bool = spec(
        False,
        fate=refused("verl's normalisation of the importance weights to mean 1 is not built"),
    )
    rollout_rs: str | None = spec(
        None,
        fate=refused(
            "verl's rejection-sampling list is not built under this name; rollout_is_mode: "
            "mask is its ratio-bound rejection at rollout_is_level token / sequence / geometric "
            "(verl's token_k1 / seq_sum_k1 / seq_mean_k1)"
        ),
    )

    @property
    def mini_batch_samples(self) -> int:
        """Samples per optimizer step (0 = the whole batch), whatever unit the YAML used."""
        if self.mini_batch_size_unit == "prompts":
            return self.mini_batch_size * self.n_samples_per_prompt
        return self.mini_batch_size

    @property
    def kl(self) -> KLPlacement:
        """Where KL goes, with which coefficient and estimator (MindSpeed-RL's meaning)."""
        coef = DEFAULT_INIT_KL_COEF if self.init_kl_coef is None else self.init_kl_coef
        if self.use_kl_in_reward:
            return KLPlacement("reward" if coef > 0 else "off", coef, self.kl_penalty)
        if self.use_kl_loss:  # verl's keys name the loss coefficient themselves
            coef = self.kl_loss_coef
        return KLPlacement("loss" if coef > 0 else "off", coef, self.kl_penalty)

    def loss_config(self, max_tokens: int | None = None) -> GRPOLossConfig:
        """The loss knobs as the loss reads them: KL in the loss where `kl` puts it there,
        and `max_tokens` (the rollout's response limit) as Dr.GRPO's constant horizon when
        `loss_agg_horizon` is unset, so every micro-batch divides by the same number."""
        knobs = {f.name: getattr(self, f.name) for f in dataclasses.fields(GRPOLossConfig)}
        horizon = None
        if self.loss_agg_mode == "seq-mean-token-sum-norm":
            horizon = self.loss_agg_horizon or max_tokens
        kl = self.kl
        knobs.update(loss_agg_horizon=horizon, use_kl_loss=kl.where == "loss", kl_loss_coef=kl.coef)
        return GRPOLossConfig(**knobs)


@dataclass(frozen=True)
class RewardConfig:
    rule_reward: bool = spec(
        True,
        help="score with the rule verifiers; with a reward model too, the sample's reward is "
        "the weighted verifier sum plus reward_model_weight x its score",
    )
    reward_model_weight: float = spec(
        1.0,
        help="mindrl: the reward model's weight when rule_reward is on beside it (MindSpeed-RL "
        "lets one source overwrite the other; mindrl adds them)",
    )
    verifier_function: tuple[str, ...] = ("base_acc",)
    verifier_weight: tuple[float, ...] = (1.0,)
    verifier_parallel: int | None = spec(
        0,
        ge=0,
        help="processes scoring rule rewards in parallel; 0/null = one per CPU within [2, 16], "
        "so one hung call never blocks the others",
    )
    verifier_timeout: float = spec(30.0, gt=0.0, help="seconds per sample")
    verifier_files: tuple[str, ...] = spec((), help="python files that register custom verifiers")
    verifier_step_budget_s: float | None = spec(
        None,
        gt=0.0,
        help="seconds per step after which a verifier that timed out or crashed in the step "
        "is stopped (queued calls skipped, running ones cut, all scored 0); null = 2 x "
        "verifier_timeout. Bounds a broken verifier's cost per step, not per sample",
    )
    verifier_max_consecutive_failures: int = spec(
        3,
        ge=0,
        help="timeouts / lost workers in a row after which a verifier is skipped for the rest "
        "of the step (circuit breaker; 0 = never): stops paying a restart per sample",
    )
    verifier_memory_mb: int = spec(
        2048,
        ge=0,
        help="cap on each verifier worker's data memory (RLIMIT_DATA, counted from zero: the "
        "worker's own imports are part of it); 0 = none. A runaway verifier gets MemoryError "
        "instead of swapping the host",
    )
    verifier_reward_bound: float = spec(
        1e4,
        gt=0.0,
        help="a verifier value with |v| above this is invalid and scores 0: one 1e30 would "
        "swamp every advantage of the batch",
    )


@dataclass(frozen=True)
class IntegratedModeConfig:
    """MindSpeed-RL's integrated_mode_config (its reference-weights path)."""

    ref_model_load_path: str | None = None


@dataclass(frozen=True)
class ResourceConfig:
    actor_resource: ResourceSpec = spec(ResourceSpec(), fate=ROLE_DEVICES)
    reference_resource: ResourceSpec | None = spec(None, fate=ROLE_DEVICES)
    reward_resource: ResourceSpec | None = spec(None, fate=ROLE_DEVICES)
    critic_resource: ResourceSpec | None = spec(None, fate=ROLE_DEVICES)
    teacher_resource: ResourceSpec | None = spec(
        None,
        fate=ROLE_DEVICES,
        help="mindrl: devices of the on-policy distillation teacher (teacher_config); unset: "
        "the actor's, with colocate_all_models",
    )
    vit_resource: ResourceSpec | None = spec(
        None, fate=refused("multimodal (a ViT worker): not built yet")
    )
    integrated_mode_config: IntegratedModeConfig | None = spec(
        None,
        fate=refused(
            "a separate reference checkpoint in integrated mode: not built yet (the reference "
            "loads actor_config.load)"
        ),
    )
    share_backbone: bool = spec(
        False,
        help="with LoRA: the reference is the actor's own model with its adapters off (no "
        "second copy of the weights, no reference processes)",
    )
    reference_in_actor: bool = spec(
        False,
        help="with use_integrated_worker: the reference is a snapshot of its weights in the "
        "actor's processes, swapped in for its pass (no reference processes)",
    )
    colocate_actor_ref: bool = False
    colocate_all_models: bool = False
    use_integrated_worker: bool = spec(
        True,
        help="MindSpeed-RL's integrated worker: the reference is built from actor_config and "
        "shares the actor's devices (no ref_config / reference_resource / reward model)",
    )
    rollout_resource: ResourceSpec | None = spec(
        None,
        help="mindrl: give rollout its own devices (a separate engine group fed through the "
        "object store); unset: a rollout engine on every actor rank (the hybrid engine)",
    )
    num_cpus_for_local_task: float = spec(
        1.0,
        gt=0.0,
        fate=no_effect(
            "mindrl starts no Ray tasks for advantages or rule rewards: the driver computes "
            "advantages, verifier_parallel processes score rewards"
        ),
    )
    num_cpus_for_placement_group: int = spec(1, ge=1, help="CPUs per device bundle")
    blocking: bool = spec(
        True,
        fate=no_effect(
            "MindSpeed-RL's non-blocking calls stream samples between a step's phases "
            "through its TransferDock (the step stays on-policy); mindrl runs a step's phases "
            "one after another, the results do not depend on it. Generation beside training "
            "(k steps off-policy) is rl_config.rollout_staleness: k"
        ),
    )
    rollout_staleness: int = spec(
        0,
        ge=0,
        help="0: each step trains on samples of the current policy; k >= 1: the rollout "
        "group (rollout_resource or vLLM servers) generates the next k steps' samples while "
        "the actor trains, none older than k updates, corrected by truncated importance "
        "sampling (trainer/pipeline.py)",
    )
    guarantee_order: bool = spec(
        False, fate=no_effect("mindrl always hands samples to each phase in batch order")
    )


@dataclass(frozen=True)
class LoggingConfig:
    use_tensorboard: bool = False
    use_wandb: bool = spec(
        False, help="log every step to a wandb run (offline unless WANDB_MODE is set)"
    )
    wandb_project: str = spec("", help="wandb project; empty: mindrl")
    wandb_exp_name: str = spec("", help="wandb run name; empty: the output folder's name")
    wandb_save_dir: str = spec("", help="folder of the wandb run folder; empty: output_dir")
    use_swanlab: bool = spec(False, help="log every step to a SwanLab run (needs swanlab)")
    swanlab_mode: str = spec(
        "", help="offline / local / cloud / online / disabled; empty: SWANLAB_MODE or offline"
    )
    swanlab_project: str = spec("", help="SwanLab project; empty: mindrl")
    swanlab_exp_name: str = spec("", help="SwanLab run name; empty: the output folder's name")
    swanlab_save_dir: str = spec("", help="folder of the SwanLab run; empty: output_dir")
    log_max_throughput: bool = spec(
        True, fate=no_effect("mindrl logs its own per-phase step timings")
    )
    log_completions: int = spec(0, ge=0, help="completions written per step to completions.jsonl")


@dataclass(frozen=True)
class LoopConfig:
    test_freq: int = spec(0, ge=0, help="validate every N steps; 0 disables")
    max_consecutive_skipped_updates: int = spec(
        3,
        ge=0,
        help="mindrl: optimizer updates skipped in a row (non-finite loss or grad norm, per "
        "role) after which the run stops with an error naming the step, before its checkpoint "
        "and the final HF export; while a streak runs, due checkpoints are deferred; 0: skip and "
        "go on",
    )
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
    "dapo": DapoConfig,
    "rollout_mode": RolloutModeConfig,
    "micro_batching": MicroBatchingConfig,
    "multimodal": MultimodalConfig,
    "transfer": TransferConfig,
    "distillation": DistillationConfig,
}


@dataclass(frozen=True)
class RLConfig:
    FLAT_GROUPS: ClassVar[bool] = True  # the groups' keys sit directly in rl_config

    algorithm: AlgorithmConfig
    reward: RewardConfig
    reward_params: RewardParams
    resources: ResourceConfig
    logging: LoggingConfig
    loop: LoopConfig
    dapo: DapoConfig
    rollout_mode: RolloutModeConfig
    micro_batching: MicroBatchingConfig
    multimodal: MultimodalConfig
    transfer: TransferConfig
    distillation: DistillationConfig
