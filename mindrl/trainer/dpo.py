"""Offline DPO (stage dpo, `cli/train_dpo.py`): the policy's worker group on megatron-core at
its TP / PP / DP, trained on stored preference pairs.

Each step draws `global_batch_size` pairs (the resumable sampler: exact resume), lays them out
as chosen / rejected rows (`pair_batch`), gets the reference's log-probs of those rows from the
reference snapshot in the actor's processes, and takes one DPO update. The reference is
computed once per batch rather than stored with the data: it then follows `ref_model` as the
run gives it, costs one forward pass of the batch, and a store stays valid for any reference.
Metrics (TRL's names) go to the console, metrics.jsonl and TensorBoard as in GRPO;
checkpoints, resume and the final HF export are GRPO's.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.config.run import RunConfig

if TYPE_CHECKING:
    from mindrl.data.pairs import PreferencePair
    from mindrl.data.sampler import ResumableSampler
    from mindrl.data.tokenizer import TokenizerSource
    from mindrl.trainer.checkpointing import CheckpointWriter
    from mindrl.trainer.metrics import MetricsLogger
    from mindrl.trainer.roles import Roles

logger = logging.getLogger("mindrl.trainer")


@dataclass
class Pairs:
    """The training pairs, the order they are drawn in, and the policy's tokenizer (its pad
    id pads the rows)."""

    pairs: list[PreferencePair]
    sampler: ResumableSampler
    tokenizer_source: TokenizerSource

    @property
    def pad_id(self) -> int:
        from mindrl.data.tokenizer import pad_id_of

        return pad_id_of(self.tokenizer_source.get())


def load_pairs(run: RunConfig) -> Pairs:
    """`data_path`'s pairwise store; a run not declared pairwise is refused, as
    MindSpeed-LLM's DPO trainer reads pairs only under `is_pairwise_dataset`."""
    from mindrl.config.errors import ConfigError
    from mindrl.data.pairs import read_pairs
    from mindrl.data.sampler import ResumableSampler
    from mindrl.data.tokenizer import DriverTokenizer

    data = run.actor.data
    if not data.is_pairwise_dataset:
        raise ConfigError(
            "megatron_training.is_pairwise_dataset: stage dpo trains on pairs; set it true"
        )
    if data.data_path is None or data.tokenizer_name_or_path is None:
        raise ConfigError("megatron_training.data_path and tokenizer_name_or_path: required")
    limit = run.actor.batch.seq_length
    stored = read_pairs(data.data_path)
    pairs = [p for p in stored if p.length <= limit]
    if len(pairs) < len(stored):
        logger.warning(
            "%d of %d pairs are longer than megatron_training.seq_length (%d tokens): left out",
            len(stored) - len(pairs),
            len(stored),
            limit,
        )
    if len(pairs) < run.actor.batch.global_batch_size:
        raise ConfigError(
            f"megatron_training: {len(pairs)} pairs of {data.data_path} within seq_length "
            f"{limit}, fewer than global_batch_size {run.actor.batch.global_batch_size}"
        )
    sampler = ResumableSampler(
        len(pairs),
        run.actor.batch.global_batch_size,
        seed=data.seed,
        shuffle=not data.no_shuffle,
        drop_last=True,
    )
    tokenizer = DriverTokenizer(data.tokenizer_name_or_path, not data.tokenizer_not_use_fast)
    return Pairs(pairs, sampler, tokenizer)


@dataclass
class DPOTrainer:
    run: RunConfig
    data: Pairs
    roles: Roles
    metrics: MetricsLogger
    checkpoints: CheckpointWriter
    start_step: int


@contextlib.contextmanager
def dpo_setup(run: RunConfig, raw: dict[str, Any]) -> Iterator[DPOTrainer]:
    """Ray, the actor's worker group with its model and reference snapshot, the sinks."""
    from mindrl.accelerator import get_accelerator
    from mindrl.cluster.placement import plan_placement
    from mindrl.cluster.ray_cluster import start_or_connect
    from mindrl.config import save_resolved_config
    from mindrl.trainer.checkpointing import CheckpointWriter, find_resume_point
    from mindrl.trainer.metrics import MetricsLogger
    from mindrl.trainer.roles import start_roles
    from mindrl.trainer.setup import one_node_cpus

    save_resolved_config(raw, Path(run.output_dir))
    data = load_pairs(run)
    resume = find_resume_point(run)
    if resume is not None:
        data.sampler.load_state_dict(resume.state.sampler)
        if not run.actor.ckpt.no_load_rng:
            resume.state.rng.restore()
        logger.info("resuming from %s at step %d", resume.iter_dir, resume.state.step)
    acc = get_accelerator(run.runtime.accelerator)
    with contextlib.ExitStack() as stack:
        stack.callback(data.tokenizer_source.close)
        cluster = stack.enter_context(start_or_connect(run.runtime, acc))
        resources = cluster.cluster_resources()
        plan = plan_placement(run, acc.ray_resource, resources.max_per_node(acc.ray_resource))
        logger.info("%s", plan.describe())
        node_cpus = one_node_cpus(resources)
        roles = start_roles(run, plan, cluster.master_addr, node_cpus, data.tokenizer_source)
        stack.callback(roles.shutdown)
        roles.actor.init_model(str(resume.iter_dir) if resume else None)
        start = resume.state.step if resume else 0
        metrics = stack.enter_context(
            MetricsLogger(
                Path(run.output_dir),
                use_tensorboard=run.rl.logging.use_tensorboard,
                total_steps=run.actor.optim.train_iters,
                start_step=start,
                tracking=run.rl.logging,
                run_config=raw,
            )
        )
        yield DPOTrainer(run, data, roles, metrics, CheckpointWriter(run), start)


def dpo_step(t: DPOTrainer, step: int) -> dict[str, float]:
    """One global batch of pairs: the reference's pass, then one DPO update."""
    from mindrl.data.pairs import pair_batch

    started = time.perf_counter()
    rows = t.data.sampler.next_batch()
    batch = pair_batch([t.data.pairs[i] for i in rows], t.data.pad_id)
    assert t.roles.ref is not None
    ref_started = time.perf_counter()
    batch = batch.with_tensors(ref_log_probs=t.roles.ref.log_probs(batch))
    ref_seconds = time.perf_counter() - ref_started
    metrics = t.roles.actor.update(batch, step)
    metrics["timing/ref"] = ref_seconds
    metrics["timing/step"] = time.perf_counter() - started
    return metrics


def train_dpo(run: RunConfig, raw: dict[str, Any]) -> int:
    """Run offline DPO for `run`; 0 on success, 1 when a worker fails or an output cannot be
    written, 2 for a damaged checkpoint, 128 + N after signal N."""
    from mindrl.checkpoint.errors import CheckpointReadError
    from mindrl.cluster.errors import WorkerGroupError
    from mindrl.storage import StorageError
    from mindrl.trainer.checkpointing import export_final
    from mindrl.trainer.interrupts import RunInterrupted, stop_on_signals
    from mindrl.trainer.run_state import RunState

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with stop_on_signals(run.runtime.stop_grace_s) as stop:
        try:
            with dpo_setup(run, raw) as t:
                stop.install()
                for step in range(t.start_step, run.actor.optim.train_iters):
                    stop.check()
                    t.metrics.log(step + 1, dpo_step(t, step))
                    if t.checkpoints.due(step + 1):
                        state = RunState.capture(step + 1, t.data.sampler.state_dict())
                        t.checkpoints.save(step + 1, t.roles.actor, state)
                export_final(run, t.roles.actor)
        except RunInterrupted as exc:
            print(f"interrupted: signal {exc.signum}", file=sys.stderr)
            return exc.exit_code
        except StorageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except CheckpointReadError as exc:
            print(f"error: damaged checkpoint: {exc}", file=sys.stderr)
            return 2
        except WorkerGroupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0
