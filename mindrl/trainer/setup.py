"""`setup(run)`: everything the loop needs, built once and typed, torn down in reverse.

The loop (`grpo.py`) receives a `Trainer` and calls step helpers with the parts they use;
nothing here holds per-step state.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.algorithms.kl import FixedKLController
from mindrl.config.run import RunConfig
from mindrl.trainer.checkpointing import CheckpointWriter, ResumePoint, find_resume_point
from mindrl.trainer.roles import Roles

if TYPE_CHECKING:
    from mindrl.cluster.placement import ClusterResources
    from mindrl.data.dataset import PromptSubset
    from mindrl.data.sampler import ResumableSampler
    from mindrl.data.tokenizer import TokenizerSource
    from mindrl.rewards.scorer import RewardScorer
    from mindrl.trainer.metrics import MetricsLogger

logger = logging.getLogger("mindrl.trainer")


@dataclass
class Prompts:
    """The training prompts, the order they are drawn in, and how to decode responses."""

    dataset: PromptSubset
    sampler: ResumableSampler
    tokenizer_source: TokenizerSource  # resolved while the workers start, loaded at first use

    @property
    def tokenizer(self) -> Any:
        """The actor's transformers tokenizer (decodes responses for the verifiers)."""
        return self.tokenizer_source.get()

    @property
    def pad_id(self) -> int:
        from mindrl.data.tokenizer import pad_id_of

        return pad_id_of(self.tokenizer)


@dataclass
class Trainer:
    run: RunConfig
    prompts: Prompts
    roles: Roles
    scorer: RewardScorer | None  # rule verifiers (None when a reward model scores)
    kl_ctrl: FixedKLController
    metrics: MetricsLogger
    checkpoints: CheckpointWriter
    start_step: int
    resumed_extra: dict[str, Any] = field(default_factory=dict)  # the checkpoint's RunState.extra

    @property
    def total_steps(self) -> int:
        return self.run.actor.optim.train_iters


def load_prompts(run: RunConfig) -> Prompts:
    """The actor's prompts and tokenizer; both paths must be set (a config loaded with
    `check_paths=False` may leave them unset)."""
    from mindrl.config.errors import ConfigError
    from mindrl.data.dataset import PromptDataset, PromptSubset
    from mindrl.data.sampler import ResumableSampler
    from mindrl.data.tokenizer import DriverTokenizer

    data = run.actor.data
    if data.data_path is None:
        raise ConfigError(
            "megatron_training.data_path: required (output of cli/preprocess_data.py)"
        )
    if data.tokenizer_name_or_path is None:
        raise ConfigError(
            "actor_config.tokenizer_name_or_path: required (an HF model or tokenizer folder)"
        )
    max_prompt = run.rl.algorithm.max_prompt_length
    dataset = PromptSubset(PromptDataset(data.data_path), max_prompt)
    if dataset.dropped:
        logger.warning(
            "%d of %d prompts are longer than rl_config.max_prompt_length (%d tokens): left out",
            dataset.dropped,
            len(dataset.dataset),
            max_prompt,
        )
    if not len(dataset):
        raise ConfigError(
            f"rl_config.max_prompt_length: {max_prompt} leaves no prompt of {data.data_path}"
        )
    sampler = ResumableSampler(
        len(dataset),
        run.actor.batch.global_batch_size,
        seed=data.seed,
        shuffle=not data.no_shuffle,
        drop_last=True,
    )
    tokenizer = DriverTokenizer(data.tokenizer_name_or_path, not data.tokenizer_not_use_fast)
    return Prompts(dataset, sampler, tokenizer)


def kl_controller(run: RunConfig) -> FixedKLController:
    from mindrl.algorithms import KLControlConfig, make_kl_controller

    alg = run.rl.algorithm
    return make_kl_controller(
        KLControlConfig(
            type=alg.kl_ctrl_type,
            kl_coef=alg.kl.coef if alg.kl.where == "reward" else 0.0,
            target_kl=alg.kl_target,
            horizon=alg.kl_horizon,
        )
    )


def restore_driver_state(
    resume: ResumePoint, prompts: Prompts, kl_ctrl: FixedKLController, run: RunConfig
) -> None:
    prompts.sampler.load_state_dict(resume.state.sampler)
    if resume.state.kl_ctrl:
        kl_ctrl.load_state_dict(resume.state.kl_ctrl)
    if not run.actor.ckpt.no_load_rng:
        resume.state.rng.restore()
    logger.info("resuming from %s at step %d", resume.iter_dir, resume.state.step)


def start_models(run: RunConfig, roles: Roles, resume: ResumePoint | None) -> None:
    """Every role's model on its ranks; the rollout engines, then their first weights."""
    info = roles.actor.init_model(str(resume.iter_dir) if resume else None)
    if run.actor.lora.enabled:
        trainable, total = info["trainable_params"], info["total_params"]
        logger.info(
            "trainable parameters: %d of %d (%.3f%%, LoRA r=%d on %s)",
            trainable,
            total,
            100.0 * trainable / max(total, 1),
            run.actor.lora.lora_r,
            ", ".join(run.actor.lora.targets),
        )
    if roles.ref is not None:
        roles.ref.init_model()
    if roles.reward is not None:
        roles.reward.init_model()
    if roles.critic is not None:
        roles.critic.init_model(str(resume.iter_dir) if resume else None)
    if roles.teacher is not None:
        roles.teacher.init_model()
    if roles.rollout is not None:
        roles.rollout.start(roles.actor)


def one_node_cpus(resources: ClusterResources) -> float | None:
    """The CPUs of a one-node cluster, at most this machine's (Ray may be told more than it
    has: `runtime.ray_num_cpus`); None on several nodes."""
    from mindrl.cluster.launch import count_cpus

    if len(resources.nodes) != 1:
        return None
    return min(resources.nodes[0].get("CPU", 0.0), float(count_cpus()))


@contextlib.contextmanager
def setup(run: RunConfig, raw: dict[str, Any]) -> Iterator[Trainer]:
    """Ray, the role workers with their models, the reward pool and the metrics sinks."""
    from mindrl.accelerator import get_accelerator
    from mindrl.cluster.placement import plan_placement
    from mindrl.cluster.ray_cluster import start_or_connect
    from mindrl.config import save_resolved_config
    from mindrl.config.secrets import redacted
    from mindrl.rewards.scorer import RewardScorer
    from mindrl.trainer.metrics import MetricsLogger
    from mindrl.trainer.roles import start_roles, sync_weights

    save_resolved_config(raw, Path(run.output_dir))
    prompts = load_prompts(run)
    kl_ctrl = kl_controller(run)
    resume = find_resume_point(run)
    if resume is not None:
        restore_driver_state(resume, prompts, kl_ctrl, run)
    start_step = resume.state.step if resume else 0
    acc = get_accelerator(run.runtime.accelerator)
    rw = run.rl.reward
    with contextlib.ExitStack() as stack:
        stack.callback(prompts.tokenizer_source.close)
        scorer = None
        if rw.rule_reward:
            scorer = stack.enter_context(RewardScorer.from_config(rw, run.rl.reward_params))
        cluster = stack.enter_context(start_or_connect(run.runtime, acc))
        resources = cluster.cluster_resources()
        plan = plan_placement(run, acc.ray_resource, resources.max_per_node(acc.ray_resource))
        logger.info("%s", plan.describe())
        roles = start_roles(
            run, plan, cluster.master_addr, one_node_cpus(resources), prompts.tokenizer_source
        )
        stack.callback(roles.shutdown)
        start_models(run, roles, resume)
        sync_weights(roles)
        metrics = stack.enter_context(
            MetricsLogger(
                Path(run.output_dir),
                use_tensorboard=run.rl.logging.use_tensorboard,
                total_steps=run.actor.optim.train_iters,
                log_completions=run.rl.logging.log_completions,
                start_step=start_step,
                tracking=run.rl.logging,  # use_wandb / use_swanlab
                run_config=redacted(raw),  # the trackers upload it
            )
        )
        yield Trainer(
            run=run,
            prompts=prompts,
            roles=roles,
            scorer=scorer,
            kl_ctrl=kl_ctrl,
            metrics=metrics,
            checkpoints=CheckpointWriter(run),
            start_step=start_step,
            resumed_extra=dict(resume.state.extra) if resume else {},
        )
