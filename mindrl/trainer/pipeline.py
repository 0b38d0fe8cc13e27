"""The bounded-staleness pipeline (`rl_config.rollout_staleness: k`, k >= 1): the rollout
group generates the batches of the next k steps while the actor trains on this one.

    step s:  take batch s (generated during an earlier step) -> start generating the batches
             up to step s + k with the engine's weights (after update s-1) -> score,
             reference, update s -> wait until every batch in flight is generated -> the
             weights of update s into the engines

A batch in flight finishes under the weights it started with: the driver waits for every
batch in flight before the push, so a generation never sees its weights change (the engine
calls are whole-batch; no request is cut at a push). The rollout group therefore generates
one batch per step beside training, k steps ahead. Every sample carries the policy version
that generated it (`meta["policy_version"]`, the number of updates behind its weights; all of
a sample's tokens come from that one version), and a sample trained at step s has staleness
s - version <= k, asserted when the batch is taken: batch s + k is drawn at step s, with the
weights of update s - 1. The first step's batch (and the first after a resume) is generated
synchronously with the current weights (staleness 0), and the staleness then rises by one
per step up to k. The engine's log-probs come with the samples, so truncated importance
sampling corrects the drift (`use_tis`, on by default in this mode).

A checkpoint records the prompt sampler as it was before the oldest batch in flight was
drawn: a resumed run draws the same prompts for its next steps and regenerates them with the
checkpoint's weights (staleness 0 again at first, so its samples are not the straight run's).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mindrl.data.batch import SampleBatch
from mindrl.trainer.metrics import Timer
from mindrl.trainer.rollout_step import (
    rows_to_batch,
    spread_prompts,
    step_sampling,
    tools_kwargs_per_rank,
)
from mindrl.trainer.scoring import Scored, score_batch
from mindrl.trainer.setup import Trainer


@dataclass
class InFlight:
    """A generation the rollout group is running for `step`."""

    step: int
    version: int  # the policy version of the engine's weights
    records: list[Any]
    prompts: list[list[int]]
    chunks: list[Any]
    slices: list[int]
    refs: Any  # the rollout group's handle from `generate_async`, given back to `collect`
    dispatched: float
    sampler_state: dict[str, Any]  # the sampler before these prompts were drawn
    rows: list[Any] | None = None  # filled by `_collect`


class StalenessExceeded(AssertionError):
    """A sample older than `rollout_staleness` reached the update (a pipeline bug)."""


def staleness_metrics(step: int, versions: list[int], bound: int) -> dict[str, float]:
    """The batch's staleness histogram from its per-sample policy versions: mean, max and
    the share of samples of each age 0..bound; raises when a sample is older than `bound`."""
    ages = [step - v for v in versions]
    if any(age > bound or age < 0 for age in ages):
        raise StalenessExceeded(
            f"step {step}: sample ages {sorted(set(ages))} outside 0..{bound} "
            f"(rollout_staleness: {bound})"
        )
    counts = Counter(ages)
    out = {
        "rollout/staleness": sum(ages) / len(ages),
        "rollout/staleness_mean": sum(ages) / len(ages),
        "rollout/staleness_max": float(max(ages)),
    }
    out.update(
        {f"rollout/staleness_share_{age}": counts[age] / len(ages) for age in range(bound + 1)}
    )
    return out


class StalenessPipeline:
    """Generation of the next k steps' batches beside the current step's training."""

    def __init__(self, t: Trainer) -> None:
        if t.roles.rollout is None:
            raise ValueError("the rollout pipeline needs a separate rollout group")
        self.t = t
        self.rollout = t.roles.rollout
        self.bound = t.run.rl.resources.rollout_staleness
        self.engine_version = t.start_step  # updates behind the engine's weights
        self.queue: deque[InFlight] = deque()  # oldest first
        self.rollout_idle_since: float | None = None  # the batches in flight all generated
        self.taken_wait = 0.0  # seconds `take` blocked on this step's batch

    def take(
        self, step: int, timer: Timer, between_phases: Callable[[], None]
    ) -> tuple[SampleBatch, Scored, dict[str, float]]:
        """Step `step`'s batch, scored: the one generated during an earlier step, or, for the
        first step (and the first after a resume), generated now."""
        started = time.perf_counter()
        if not self.queue or self.queue[0].step != step:
            self.queue.clear()  # nothing in flight at a run's first step
            with timer("rollout"):
                self.queue.append(self._dispatch(step))
                self._collect(self.queue[0])
        flight = self.queue.popleft()
        self._collect(flight)
        self.taken_wait = time.perf_counter() - started
        assert flight.rows is not None
        batch = rows_to_batch(
            flight.records,
            flight.prompts,
            flight.chunks,
            flight.slices,
            flight.rows,
            self.t.prompts.pad_id,
        )
        batch = batch.with_meta(policy_version=[flight.version] * batch.size)
        metrics = staleness_metrics(step, batch.meta["policy_version"], self.bound)
        metrics["timing/trainer_wait_samples"] = self.taken_wait
        between_phases()
        with timer("reward"):
            scored = score_batch(self.t, batch)
        between_phases()
        return batch, scored, metrics

    def start_next(self, step: int) -> dict[str, float]:
        """Start generating the batches of steps up to `step + k` (none past the last step);
        how long the rollout group had nothing to generate since its last batch was done
        (at least: the driver sees a batch done only when it waits for it)."""
        last = min(step + self.bound, self.t.total_steps - 1)
        following = self.queue[-1].step + 1 if self.queue else step + 1
        for upcoming in range(following, last + 1):
            self.queue.append(self._dispatch(upcoming))
        out = {}
        if self.rollout_idle_since is not None:
            out["timing/rollout_wait_weights"] = time.perf_counter() - self.rollout_idle_since
            self.rollout_idle_since = None
        return out

    def wait(self) -> dict[str, float]:
        """Block until every batch in flight is generated (before the weights change under
        them); how long the driver waited here (`timing/rollout_wait`) and in all this step
        (`timing/trainer_wait_samples`, with `take`'s wait), and how much of the newest
        batch's generation ran behind training."""
        if not self.queue:
            return {}
        started = time.perf_counter()
        for flight in self.queue:
            self._collect(flight)
        done = time.perf_counter()
        self.rollout_idle_since = done
        waited = done - started
        hidden = started - self.queue[-1].dispatched
        return {
            "timing/rollout_wait": waited,
            "timing/trainer_wait_samples": self.taken_wait + waited,
            "timing/rollout_hidden": hidden,
            "timing/overlap": hidden / (hidden + waited) if hidden + waited > 0 else 1.0,
        }

    def synced(self, step: int) -> None:
        """The engines now hold the weights of update `step` (0-based)."""
        self.engine_version = step + 1

    def sampler_state(self) -> dict[str, Any]:
        """The prompt sampler as a checkpoint should record it: before the oldest batch in
        flight was drawn (a resumed run draws those prompts again)."""
        if self.queue:
            return self.queue[0].sampler_state
        return self.t.prompts.sampler.state_dict()

    def _dispatch(self, step: int) -> InFlight:
        sampler = self.t.prompts.sampler
        before = sampler.state_dict()
        records = self.t.prompts.dataset.batch(sampler.next_batch())
        prompts, chunks, slices = spread_prompts(self.rollout, records)
        self.rollout.rollout_mode()  # the engines stay awake: their devices are their own
        refs = self.rollout.generate_async(
            [list(chunks[s]) for s in slices],
            step_sampling(self.t.run, step),
            tools_kwargs_per_rank(records, slices),
        )
        return InFlight(
            step=step,
            version=self.engine_version,
            records=records,
            prompts=prompts,
            chunks=list(chunks),
            slices=list(slices),
            refs=refs,
            dispatched=time.perf_counter(),
            sampler_state=before,
        )

    def _collect(self, flight: InFlight) -> None:
        if flight.rows is None:
            flight.rows = self.rollout.collect(flight.refs)
