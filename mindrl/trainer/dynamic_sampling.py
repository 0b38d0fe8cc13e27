"""A step's rollout and scores: one generation batch, or with DAPO's dynamic sampling
(stage ray_dapo, ``filter_groups_enable``) as many as it takes to hold
``filter_groups_train_batch_size`` prompts whose ``filter_groups_metric`` scores differ.

A group whose scores tie has zero advantage for every sample: it costs the update and gives
no gradient. Kept groups are taken in generation order; the last batch's surplus is
dropped; no weights change between the batches of a step, so they all come from the same
policy. Each batch draws the sampler's next prompts (a resumed run draws the same ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mindrl.data.batch import SampleBatch
from mindrl.trainer.metrics import Timer
from mindrl.trainer.rollout_step import generate_batch, step_sampling, step_seed
from mindrl.trainer.scoring import Scored, score_batch
from mindrl.trainer.setup import Trainer


class DynamicSamplingError(RuntimeError):
    """filter_groups_max_batches generation batches did not hold enough varied groups."""


def rollout_and_score(
    t: Trainer, step: int, timer: Timer, between_phases: Callable[[], None]
) -> tuple[SampleBatch, Scored, dict[str, float]]:
    """The samples the step trains on, their scores, and the sampling metrics."""
    if t.run.filters_groups:
        return _filtered(t, step, timer, between_phases)
    batch, scored = _one_batch(t, step, 0, timer, between_phases)
    return batch, scored, {}


def _one_batch(
    t: Trainer, step: int, index: int, timer: Timer, between_phases: Callable[[], None]
) -> tuple[SampleBatch, Scored]:
    sampling = step_sampling(t.run, step)
    if index:  # another draw of the same step: its own seed
        sampling = replace(sampling, seed=step_seed(t.run, step) * 1009 + index)
    records = t.prompts.dataset.batch(t.prompts.sampler.next_batch())
    with timer("rollout"):
        batch = generate_batch(t.roles.generator, records, sampling, t.prompts.pad_id)
    between_phases()
    with timer("reward"):
        scored = score_batch(t, batch)
    between_phases()
    return batch, scored


def _filtered(
    t: Trainer, step: int, timer: Timer, between_phases: Callable[[], None]
) -> tuple[SampleBatch, Scored, dict[str, float]]:
    from mindrl.algorithms.dapo import GroupFilter

    dapo, n = t.run.rl.dapo, t.run.rl.algorithm.n_samples_per_prompt
    groups = GroupFilter(dapo.filter_groups_train_batch_size, n, dapo.filter_groups_max_batches)
    kept: list[tuple[SampleBatch, Scored]] = []
    batch_metrics: list[dict[str, float]] = []
    while not groups.satisfied:
        if groups.exhausted:
            raise DynamicSamplingError(
                f"dynamic sampling at step {step + 1}: {groups.batches} generation batch(es) "
                f"of {t.run.actor.batch.global_batch_size} prompts (rl_config."
                f"filter_groups_max_batches: {dapo.filter_groups_max_batches}) held "
                f"{groups.kept_groups} prompts whose {dapo.filter_groups_metric} scores differ,"
                f" filter_groups_train_batch_size asks for {groups.target_groups}: the others "
                "scored alike. Raise filter_groups_max_batches (<= 0: no limit) or check the "
                "data and the verifier"
            )
        batch, scored = _one_batch(t, step, groups.batches, timer, between_phases)
        keep = groups.add(scored.per_function[dapo.filter_groups_metric])
        batch_metrics.append(scored.metrics)
        if keep.numel():
            kept.append((batch.select(keep), scored.select(keep)))
    # reward metrics over every generated sample (the batches are of equal size)
    metrics = {
        key: sum(m[key] for m in batch_metrics) / len(batch_metrics) for key in batch_metrics[0]
    }
    sampling = {
        "train/num_gen_batches": float(groups.batches),
        "dapo/kept_prompts": float(groups.kept_groups),
        # prompts whose scores all tied (the surplus of varied ones is not counted)
        "dapo/filtered_prompts": float(groups.seen_groups - groups.varied_groups),
    }
    merged = SampleBatch.concat([b for b, _ in kept])
    return merged, Scored.concat([s for _, s in kept], metrics), sampling
