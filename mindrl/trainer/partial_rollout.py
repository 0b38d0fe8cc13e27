"""Partial rollout (MindSpeed-RL's `rl_config.partial_rollout_max_split: N`, N > 1).

A long response need not hold up a step: each generation round gives every unfinished sample
at most ``max_tokens // N`` more tokens (the N-th round what is left of ``max_tokens``), and
a step trains as soon as ``global_batch_size`` prompts have all their samples finished. The
others wait in a pool and are continued in the next step, with the weights of the update in
between, so one response can hold tokens of several policies. Each token keeps the engine's
log-prob from the round that generated it, so truncated importance sampling (on by default in
this mode) weighs every token against the policy that produced it; each sample records the
oldest policy version among its tokens (`meta["policy_version"]`).

As in MindSpeed-RL's synchronous engine: the pool holds up to twice the batch (a new batch
of prompts joins every step but the last), the oldest complete prompts train first, and every
unfinished sample gets at least one round per step, so a response is finished within N steps
of its prompt joining. The pool is driver state: a checkpoint records it (`state_dict`), so a
resumed run continues the same partial responses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mindrl.data.batch import SampleBatch, build_sample_batch
from mindrl.trainer.metrics import Timer
from mindrl.trainer.rollout_step import (
    dataset_columns,
    generate_rows,
    step_sampling,
    step_seed,
)
from mindrl.trainer.scoring import Scored, score_batch
from mindrl.trainer.setup import Trainer

STATE_KEY = "partial_rollout"  # in RunState.extra


@dataclass
class PartialSample:
    """One response so far; `versions[i]` is the policy version (updates applied to the
    engine's weights) that generated token i."""

    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    rounds: int = 0
    finish_reason: str | None = None  # None while unfinished

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def extend(self, tokens: list[int], log_probs: list[float], version: int) -> None:
        self.tokens.extend(tokens)
        self.log_probs.extend(log_probs)
        self.versions.extend([version] * len(tokens))
        self.rounds += 1


@dataclass
class PromptGroup:
    """A prompt's n samples; `index` is its record in the prompt store, `joined` the step it
    entered the pool."""

    index: int
    joined: int
    samples: list[PartialSample]

    @property
    def complete(self) -> bool:
        return all(s.finished for s in self.samples)


def round_budget(sample: PartialSample, max_tokens: int, splits: int) -> int:
    """Tokens `sample` may add this round: max_tokens // splits, all that is left in its
    last round."""
    left = max_tokens - len(sample.tokens)
    if sample.rounds >= splits - 1:
        return left
    return min(max(max_tokens // splits, 1), left)


def finish_reason(sample: PartialSample, engine_reason: str, max_tokens: int) -> str | None:
    """Finished on a stop token, or at max_tokens; a round's own cut leaves it unfinished."""
    if engine_reason == "stop":
        return "stop"
    return "length" if len(sample.tokens) >= max_tokens else None


class PartialRollout:
    """The pool of partial responses and the rounds that finish them."""

    def __init__(self, t: Trainer) -> None:
        self.t = t
        self.splits = t.run.rl.rollout_mode.partial_rollout_max_split
        self.n = t.run.rl.algorithm.n_samples_per_prompt
        self.gbs = t.run.actor.batch.global_batch_size
        self.max_tokens = t.run.generate.sampling_config.max_tokens
        self.pool: list[PromptGroup] = []
        self.version = t.start_step  # updates applied to the engines' weights

    # -- the step ----------------------------------------------------------------------
    def take(
        self, step: int, timer: Timer, between_phases: Callable[[], None]
    ) -> tuple[SampleBatch, Scored, dict[str, float]]:
        """Step `step`'s batch: new prompts in, rounds until `gbs` prompts are complete,
        the oldest complete ones out, scored."""
        self._top_up(step)
        with timer("rollout"):
            rounds = self._rounds(step)
        taken = self._take_complete()
        batch = self._batch(taken)
        between_phases()
        with timer("reward"):
            scored = score_batch(self.t, batch)
        between_phases()
        samples = [s for g in taken for s in g.samples]
        return (
            batch,
            scored,
            {
                "rollout/partial_rounds": float(rounds),
                "rollout/partial_resumed": sum(len(set(s.versions)) > 1 for s in samples)
                / len(samples),
                "rollout/staleness_max": float(
                    max(step - min(s.versions, default=step) for s in samples)
                ),
                "rollout/partial_pool_prompts": float(len(self.pool)),
            },
        )

    def synced(self, step: int) -> None:
        """The engines now hold the weights of update `step` (0-based)."""
        self.version = step + 1

    def _top_up(self, step: int) -> None:
        last = step == self.t.total_steps - 1
        target = self.gbs if last else 2 * self.gbs
        while len(self.pool) < target:
            indices = self.t.prompts.sampler.next_batch()
            self.pool.extend(
                PromptGroup(i, step, [PartialSample() for _ in range(self.n)]) for i in indices
            )

    def _rounds(self, step: int) -> int:
        """Generation rounds over the unfinished samples: at least one, then until `gbs`
        prompts are complete (every sample finishes by its N-th round, so this ends)."""
        gen = self.t.roles.generator
        gen.rollout_mode()
        rounds = 0
        try:
            while rounds == 0 or sum(g.complete for g in self.pool) < self.gbs:
                open_samples = [(g, s) for g in self.pool for s in g.samples if not s.finished]
                if not open_samples:
                    break
                self._round(step, rounds, open_samples)
                rounds += 1
        finally:
            gen.train_mode()
        return rounds

    def _round(
        self, step: int, index: int, open_samples: list[tuple[PromptGroup, PartialSample]]
    ) -> None:
        """One round: each open sample continues from its tokens so far, grouped by budget
        (one engine call per budget; at most two differ)."""
        records = self.t.prompts.dataset.batch([g.index for g, _ in open_samples])
        base = step_sampling(self.t.run, step)
        seed = step_seed(self.t.run, step)
        by_budget: dict[int, list[int]] = {}
        for k, (_, sample) in enumerate(open_samples):
            by_budget.setdefault(round_budget(sample, self.max_tokens, self.splits), []).append(k)
        for budget, members in sorted(by_budget.items()):
            sampling = replace(
                base, n=1, max_tokens=budget, seed=(seed * 1009 + index) * 7 + budget
            )
            prompts = [list(records[k].prompt_ids) + open_samples[k][1].tokens for k in members]
            rows = generate_rows(self.t.roles.generator, prompts, sampling)
            for k, row in zip(members, rows):
                sample = open_samples[k][1]
                sample.extend(list(row.token_ids), list(row.log_probs), self.version)
                sample.finish_reason = finish_reason(sample, row.finish_reason, self.max_tokens)

    def _take_complete(self) -> list[PromptGroup]:
        """The `gbs` oldest complete prompts (pool order breaks ties), out of the pool."""
        complete = sorted((g for g in self.pool if g.complete), key=lambda g: g.joined)
        taken = complete[: self.gbs]
        chosen = {id(g) for g in taken}
        self.pool = [g for g in self.pool if id(g) not in chosen]
        return taken

    def _batch(self, taken: list[PromptGroup]) -> SampleBatch:
        records = self.t.prompts.dataset.batch([g.index for g in taken])
        rows = [(rec, s) for rec, g in zip(records, taken) for s in g.samples]
        return build_sample_batch(
            [list(rec.prompt_ids) for rec, _ in rows],
            [s.tokens for _, s in rows],
            self.t.prompts.pad_id,
            meta={
                "label": [rec.label for rec, _ in rows],
                "prompt_text": [rec.prompt_text for rec, _ in rows],
                "finish_reason": [s.finish_reason for _, s in rows],
                "extra": [dataset_columns(rec) for rec, _ in rows],
                "policy_version": [min(s.versions) for _, s in rows],
            },
            rollout_log_probs=[s.log_probs for _, s in rows],
        )

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-ready: the pool's prompts and partial responses."""
        return {"pool": [asdict(g) for g in self.pool]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool = [
            PromptGroup(
                int(g["index"]),
                int(g["joined"]),
                [PartialSample(**s) for s in g["samples"]],
            )
            for g in state.get("pool", [])
        ]
