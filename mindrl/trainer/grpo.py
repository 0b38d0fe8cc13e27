"""The GRPO / DAPO / PPO loop. One step, as docs/architecture.md draws it:

    prompts -> actor.generate (n per prompt; with rollout_staleness k an earlier step
    generated them, `trainer/pipeline.py`) -> rule rewards -> reference and old log-probs
    (old ones only when the batch gets more than one optimizer step) -> [PPO: critic values]
    -> advantages (group, or GAE) -> [PPO: critic.update on the returns]
    -> actor.update (mini-batches x micro-batches) -> actor.sync_weights

The driver holds no model: it owns the batch and calls typed role facades, which own the
models. Placement (hybrid engine or not, colocation) lives in the workers and the plan, not
here.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.config.run import RunConfig
from mindrl.rollout.agent_turns import agent_step_metrics
from mindrl.trainer.advantage_step import compute_step_advantages, uses_kl_in_reward
from mindrl.trainer.dynamic_sampling import rollout_and_score
from mindrl.trainer.metrics import Timer
from mindrl.trainer.partial_rollout import PartialRollout
from mindrl.trainer.pipeline import StalenessPipeline
from mindrl.trainer.roles import sync_weights
from mindrl.trainer.rollout_step import generate_batch, step_sampling
from mindrl.trainer.scoring import Scored, score_batch
from mindrl.trainer.setup import Trainer
from mindrl.trainer.step_metrics import padding_metrics, step_metrics

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("mindrl.trainer")


def recomputes_old_log_probs(run: RunConfig) -> bool:
    """Whether the old policy's log-probs need their own forward pass: only when a batch
    gets several optimizer steps (later ones see a moved policy; with
    `recompute_old_log_prob: in_update` the update makes them itself) or the KL-in-reward
    penalty reads them before the update, or on-policy distillation compares them with the
    teacher's."""
    alg = run.rl.algorithm
    if uses_kl_in_reward(alg) or alg.recompute_old_log_prob == "always":
        return True
    if run.rl.distillation.use_opd:  # the student's log-probs of its samples, before the update
        return True
    # in_update: the actor's update computes what its later mini-batches need
    return run.optimizer_steps_per_rl_step > 1 and alg.recompute_old_log_prob == "auto"


@dataclass(frozen=True)
class StepLogProbs:
    """One batch's log-probs of its tokens: the reference's, the old policy's (the
    student's, for distillation) and the distillation teacher's; None where not computed."""

    ref: torch.Tensor | None
    old: torch.Tensor | None
    teacher: torch.Tensor | None = None


def log_probs_passes(t: Trainer, batch: Any, timer: Timer) -> StepLogProbs:
    """The reference's, the teacher's and the old policy's log-probs of the batch. The
    reference and teacher passes are started first and the old-policy pass runs while they
    go: on their own workers they overlap (`timing/ref` and `timing/teacher` are then their
    latencies from their start, and the timings add up to more than `timing/log_probs`, the
    wall time of all)."""
    roles = t.roles
    old_lp = None
    with timer("log_probs"):
        start = time.perf_counter()
        pending = roles.ref.start_log_probs(batch) if roles.ref is not None else None
        teaching = roles.teacher.start_log_probs(batch) if roles.teacher is not None else None
        if recomputes_old_log_probs(t.run):  # else on-policy: the update's own log-probs
            with timer("old_log_prob"):
                old_lp = roles.actor.log_probs(batch)
        ref_lp = pending.result() if pending is not None else None
        if pending is not None:
            timer.record("ref", time.perf_counter() - start)
        teacher_lp = teaching.result() if teaching is not None else None
        if teaching is not None:
            timer.record("teacher", time.perf_counter() - start)
    return StepLogProbs(ref_lp, old_lp, teacher_lp)


def grpo_step(
    t: Trainer,
    step: int,
    between_phases: Callable[[], None] = lambda: None,
    pipeline: StalenessPipeline | None = None,
    partial: PartialRollout | None = None,
) -> tuple[dict[str, float], Scored]:
    """One RL step; its metrics and the scored samples. `between_phases` runs at every
    phase boundary (where a stop request ends the step). With a `pipeline` the step trains on
    the batch generated during an earlier step and starts generating the next ones; with
    `partial` rollout it trains on the prompts the pool has completed."""
    roles, run, timer = t.roles, t.run, Timer()
    with timer("step"):
        if pipeline is not None:
            batch, scored, sampling_metrics = pipeline.take(step, timer, between_phases)
            sampling_metrics.update(pipeline.start_next(step))
        elif partial is not None:
            batch, scored, sampling_metrics = partial.take(step, timer, between_phases)
        else:  # one generation batch, or DAPO's dynamic sampling over several
            batch, scored, sampling_metrics = rollout_and_score(t, step, timer, between_phases)
        passes = log_probs_passes(t, batch, timer)
        ref_lp, old_lp = passes.ref, passes.old
        if old_lp is not None:
            batch = batch.with_tensors(old_log_probs=old_lp)
        values = None
        if roles.critic is not None:
            with timer("values"):
                values = roles.critic.values(batch)
        between_phases()
        with timer("adv"):
            adv = compute_step_advantages(
                batch,
                scored.scores,
                run.rl.algorithm,
                t.kl_ctrl,
                old_lp,
                ref_lp,
                values,
                teacher=passes.teacher,
                distillation=run.rl.distillation,
            )
        batch = batch.with_response_mask(adv.response_mask).with_tensors(advantages=adv.values)
        if ref_lp is not None:
            batch = batch.with_tensors(ref_log_probs=ref_lp)
        critic_metrics: dict[str, float] = {}
        if roles.critic is not None and values is not None and adv.returns is not None:
            with timer("critic_update"):
                critic_metrics = roles.critic.update(
                    batch.with_tensors(values=values, returns=adv.returns), step
                )
        with timer("update"):
            update = roles.actor.update(batch, step)
        if pipeline is not None:  # the batches in flight finish before the weights change
            sampling_metrics.update(pipeline.wait())
        with timer("sync"):
            sync = sync_weights(roles)
        if pipeline is not None:
            pipeline.synced(step)
        if partial is not None:
            partial.synced(step)
    metrics = step_metrics(
        batch,
        scored.scores,
        timer.metrics(),
        scored.metrics,
        adv.metrics,
        update,
        sync,
        epochs=run.rl.algorithm.epochs,
    )
    padding = padding_metrics(batch, run, old_lp is not None)
    agent = agent_step_metrics(batch.meta.get("agent", []))  # multi-turn rollout only
    return {**metrics, **sampling_metrics, **critic_metrics, **padding, **agent}, scored


def run_state_now(
    t: Trainer,
    step: int,
    pipeline: StalenessPipeline | None = None,
    partial: PartialRollout | None = None,
) -> Any:
    """What a checkpoint of `step` records of the driver (the sampler as it was before a
    batch in flight was drawn; partial rollout's pool)."""
    from mindrl.trainer.partial_rollout import STATE_KEY
    from mindrl.trainer.run_state import RunState

    sampler = pipeline.sampler_state() if pipeline else t.prompts.sampler.state_dict()
    extra = {STATE_KEY: partial.state_dict()} if partial else None
    return RunState.capture(step, sampler, t.kl_ctrl.state_dict(), extra)


@dataclass
class Progress:
    completed: int = 0  # steps whose metrics were logged


def train_loop(t: Trainer, between_phases: Callable[[], None], progress: Progress) -> None:
    """Validation before training if asked, the steps, checkpoints, the final export. Too
    many updates skipped in a row stop the run (NonFiniteTrainingError) before that step's
    checkpoint and the export; a checkpoint due while a streak runs is deferred."""
    from mindrl.logs import driver_log_failure
    from mindrl.trainer.checkpointing import export_final
    from mindrl.trainer.interrupts import RunInterrupted
    from mindrl.trainer.nonfinite_stop import SkippedUpdateStop
    from mindrl.trainer.profiling_steps import StepProfiling

    loop = t.run.rl.loop
    progress.completed = t.start_step
    if loop.val_before_train or loop.val_only:
        _log_validation(t, t.start_step)
    if loop.val_only:
        return
    pipeline = StalenessPipeline(t) if t.run.rl.resources.rollout_staleness else None
    partial = partial_rollout(t)
    profiling = StepProfiling(t.run.profiler, t.roles.groups)
    skip_stop = SkippedUpdateStop(loop.max_consecutive_skipped_updates)
    try:
        for step in range(t.start_step, t.total_steps):
            between_phases()
            profiling.begin(step - t.start_step + 1)
            metrics, scored = grpo_step(t, step, between_phases, pipeline, partial)
            t.metrics.log(step + 1, metrics)
            progress.completed = step + 1
            log_failure = driver_log_failure()
            if log_failure is not None:  # driver.log lost lines: stop rather than go on blind
                raise log_failure
            if t.run.rl.logging.log_completions:
                t.metrics.log_completions(step + 1, scored.completions)
            skip_stop.check(step + 1, metrics)
            if t.checkpoints.due(step + 1) and skip_stop.defers_checkpoint(metrics):
                streaks = skip_stop.streaks(metrics).items()
                logger.warning(
                    "step %d: checkpoint deferred while updates are skipped as non-finite (%s)",
                    step + 1,
                    ", ".join(f"{role}: {n} in a row" for role, n in streaks if n),
                )
            elif t.checkpoints.due(step + 1):
                state = run_state_now(t, step + 1, pipeline, partial)
                t.checkpoints.save(step + 1, t.roles.actor, state, t.roles.critic)
            if validation_due(t, step + 1):
                _log_validation(t, step + 1)
    except RunInterrupted:  # stop now: a capture still running is not waited for
        raise
    except Exception:  # a capture still running is written, and the error raised
        profiling.finish(failed=True)
        raise
    profiling.finish()
    export_final(t.run, t.roles.actor)


def partial_rollout(t: Trainer) -> PartialRollout | None:
    """Partial rollout's pool (`partial_rollout_max_split` > 1), as a resumed checkpoint left
    it."""
    from mindrl.trainer.partial_rollout import STATE_KEY

    if t.run.rl.rollout_mode.partial_rollout_max_split <= 1:
        return None
    partial = PartialRollout(t)
    if STATE_KEY in t.resumed_extra:
        partial.load_state_dict(t.resumed_extra[STATE_KEY])
    return partial


def validation_due(t: Trainer, step: int) -> bool:
    freq = t.run.rl.loop.test_freq
    return freq > 0 and step % freq == 0


def validate(t: Trainer, step: int) -> dict[str, float] | None:
    """Held-out prompts answered greedily and scored by the same verifiers: `val/score` and
    the per-verifier means on `rl_config.val_data_path` (None without it)."""
    from mindrl.data.dataset import PromptDataset

    path = t.run.rl.loop.val_data_path
    if not path:
        logger.warning("validation requested but rl_config.val_data_path is not set")
        return None
    val = PromptDataset(path)
    slices = max(t.roles.generator.rollout_ranks()) + 1
    usable = len(val) - len(val) % slices
    records = val.batch(list(range(usable)))
    batch = generate_batch(
        t.roles.generator, records, step_sampling(t.run, step, validation=True), t.prompts.pad_id
    )
    scored = score_batch(t, batch)
    out = {"val/score": float(scored.scores.mean())}
    out.update({f"val/{k}": v for k, v in scored.metrics.items() if k.endswith("_rewards/mean")})
    return out


def _log_validation(t: Trainer, step: int) -> None:
    out = validate(t, step)
    if out is not None:
        t.metrics.log(step, out)


def train(run: RunConfig, raw: dict[str, Any]) -> int:
    """Run GRPO for `run`; 0 on success, 1 when a worker fails, an output cannot be written
    (named in the message) or updates keep being skipped as non-finite, 2 for a damaged
    checkpoint, 128 + N after signal N."""
    from mindrl.checkpoint.errors import CheckpointReadError
    from mindrl.cluster.errors import WorkerGroupError
    from mindrl.storage import StorageError
    from mindrl.trainer.checkpointing import CheckpointWriter
    from mindrl.trainer.dynamic_sampling import DynamicSamplingError
    from mindrl.trainer.interrupts import RunInterrupted, stop_on_signals
    from mindrl.trainer.nonfinite_stop import NonFiniteTrainingError
    from mindrl.trainer.setup import setup

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    progress = Progress()

    def stopped(signum: int) -> int:
        last = CheckpointWriter(run).latest_name() or "none"
        print(f"interrupted at step {progress.completed}; last checkpoint {last}", file=sys.stderr)
        return RunInterrupted(signum).exit_code

    with stop_on_signals(run.runtime.stop_grace_s) as stop:
        try:
            with setup(run, raw) as t:
                stop.install()  # Ray installs its own handlers while starting
                stop.check()
                train_loop(t, stop.check, progress)
        except RunInterrupted as exc:
            return stopped(exc.signum)
        except StorageError as exc:  # a full disk or a vanished folder: named, no trace
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except DynamicSamplingError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except NonFiniteTrainingError as exc:
            last = CheckpointWriter(run).latest_name() or "none"
            print(f"error: {exc}; last checkpoint {last}", file=sys.stderr)
            return 1
        except CheckpointReadError as exc:
            print(f"error: damaged checkpoint: {exc}", file=sys.stderr)
            return 2
        except WorkerGroupError as exc:
            if stop.signum is not None:  # the signal reached the workers too
                return stopped(stop.signum)
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0
