"""The one-step-off pipeline (`rl_config.rollout_staleness: 1`): the rollout group generates
step k+1's samples while the actor trains on step k's.

    step k:  take batch k (generated during step k-1) -> start generating batch k+1 with the
             engine's weights (after update k-1) -> score, reference, update k -> wait for
             batch k+1 -> weights of update k into the engines

Every sample carries the policy version that generated it (the number of updates behind its
weights): batch k+1 is trained by the policy after update k, so its staleness is exactly 1,
except the first step's batch (and the first after a resume), generated synchronously with
the current weights (staleness 0). The engine's log-probs of the samples come with them, so
truncated importance sampling corrects the one update of drift (`use_tis`, on by default in
this mode).

A checkpoint records the prompt sampler as it was before the batch in flight was drawn: a
resumed run draws the same prompts for its first step and generates them with the
checkpoint's weights (staleness 0 there, so its samples are not the straight run's).
"""

from __future__ import annotations

import time
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
    rows: list[Any] | None = None  # filled by `wait`


class OneStepOffPipeline:
    """Generation of the next step's batch beside the current step's training."""

    def __init__(self, t: Trainer) -> None:
        if t.roles.rollout is None:
            raise ValueError("the one-step-off pipeline needs a separate rollout group")
        self.t = t
        self.rollout = t.roles.rollout
        self.engine_version = t.start_step  # updates behind the engine's weights
        self.flight: InFlight | None = None

    def take(
        self, step: int, timer: Timer, between_phases: Callable[[], None]
    ) -> tuple[SampleBatch, Scored, dict[str, float]]:
        """Step `step`'s batch, scored: the one generated during the previous step, or,
        for the first step, generated now."""
        flight = self.flight
        if flight is None or flight.step != step:
            with timer("rollout"):
                flight = self._dispatch(step)
                self._collect(flight)
        self.flight = None
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
        between_phases()
        with timer("reward"):
            scored = score_batch(self.t, batch)
        between_phases()
        return batch, scored, {"rollout/staleness": float(step - flight.version)}

    def start_next(self, step: int) -> None:
        """Start generating step `step + 1`'s batch (none after the last step)."""
        if step + 1 < self.t.total_steps:
            self.flight = self._dispatch(step + 1)

    def wait(self) -> dict[str, float]:
        """Block until the batch in flight is generated (before the weights change under
        it); how long the driver waited and how much of the generation ran behind training."""
        flight = self.flight
        if flight is None:
            return {}
        started = time.perf_counter()
        self._collect(flight)
        waited = time.perf_counter() - started
        hidden = started - flight.dispatched
        return {
            "timing/rollout_wait": waited,
            "timing/rollout_hidden": hidden,
            "timing/overlap": hidden / (hidden + waited) if hidden + waited > 0 else 1.0,
        }

    def synced(self, step: int) -> None:
        """The engines now hold the weights of update `step` (0-based)."""
        self.engine_version = step + 1

    def sampler_state(self) -> dict[str, Any]:
        """The prompt sampler as a checkpoint should record it: before the batch in flight
        was drawn (a resumed run draws those prompts again)."""
        if self.flight is not None:
            return self.flight.sampler_state
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
