"""What a generating worker sends back to the driver: one row per sampled response.

Workers turn their engine's `RolloutResult`s into rows (plain lists, cheap to pickle through
Ray); the driver reassembles them into a `SampleBatch`. Both sides import this module, so the
contract sits below the trainer and the workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mindrl.rollout.base import RolloutResult


@dataclass(frozen=True, slots=True)
class RolloutRow:
    """One response; `prompt_index` counts within the prompts the worker was given."""

    prompt_index: int
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str

    def shifted(self, offset: int) -> RolloutRow:
        """The same row with its prompt index counted in a larger list of prompts."""
        return RolloutRow(
            self.prompt_index + offset, self.token_ids, self.log_probs, self.finish_reason
        )


def rollout_rows(results: Iterable[RolloutResult]) -> list[RolloutRow]:
    return [
        RolloutRow(r.prompt_index, list(r.token_ids), list(r.logprobs), r.finish_reason)
        for r in results
    ]
