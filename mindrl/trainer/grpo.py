"""The GRPO loop. One step, as DESIGN.md draws it:

    prompts -> actor.generate (n per prompt) -> rule rewards -> reference and old log-probs
    (old ones only when the batch gets more than one optimizer step) -> group advantages
    -> actor.update (mini-batches x micro-batches) -> actor.sync_weights

The driver holds no model: it owns the batch and calls worker groups, which own the models.
Placement (hybrid engine or not, colocation) lives in the workers and the plan, not here.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from mindrl.config.run import RunConfig
from mindrl.trainer.context import TrainContext

logger = logging.getLogger("mindrl.trainer")


def grpo_step(ctx: TrainContext, step: int) -> dict[str, float]:
    """One RL step; returns its metrics."""
    roles, timer = ctx.roles, ctx.new_timer()
    with timer("step"):
        records = ctx.dataset.batch(ctx.sampler.next_batch())
        with timer("rollout"):
            batch = ctx.rollout(records, ctx.sampling(step))
        with timer("reward"):
            scores, reward_metrics = ctx.score(batch)
        with timer("ref"):
            ref_lp = ctx.log_probs(roles.ref, batch) if roles.ref is not None else None
        old_lp = None
        if ctx.recomputes_old_log_probs:  # else on-policy: the update's own log-probs
            with timer("old_log_prob"):
                old_lp = ctx.log_probs(roles.actor, batch)
            batch = batch.with_tensors(old_log_probs=old_lp)
        with timer("adv"):
            advantages, kl_metrics = ctx.advantages(batch, scores, old_lp, ref_lp)
        batch = batch.with_tensors(advantages=advantages)
        if ref_lp is not None:
            batch = batch.with_tensors(ref_log_probs=ref_lp)
        with timer("update"):
            update = roles.actor.dispatch_by_dp("update", batch.chunks(roles.actor.dp_size), step)[
                0
            ]
        with timer("sync"):
            sync = ctx.sync_weights()
    return ctx.step_metrics(batch, scores, timer, reward_metrics, kl_metrics, update, sync)


def train(run: RunConfig, raw: dict[str, Any]) -> int:
    """Run GRPO for `run`; 0 on success, 1 when a worker fails (named in the message)."""
    from mindrl.cluster.errors import WorkerGroupError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    ctx = TrainContext(run, raw)
    try:
        with ctx.started():
            if run.rl.loop.val_before_train or run.rl.loop.val_only:
                ctx.log_validation(ctx.start_step)
            if run.rl.loop.val_only:
                return 0
            for step in range(ctx.start_step, ctx.total_steps):
                metrics = grpo_step(ctx, step)
                ctx.logger.log(step + 1, metrics)
                ctx.log_completions(step + 1)
                if ctx.checkpoint_due(step + 1):
                    ctx.save_checkpoint(step + 1)
                if ctx.validation_due(step + 1):
                    ctx.log_validation(step + 1)
            ctx.export_final()
    except WorkerGroupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
