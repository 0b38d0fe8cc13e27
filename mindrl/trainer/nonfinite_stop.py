"""The driver's stop rule for non-finite training. A worker skips an optimizer update whose
loss or grad norm is not finite and reports how many it skipped in a row
(`{role}/consecutive_skipped_updates`); a run whose updates keep being skipped learns nothing
and would end by exporting the model that broke, so after
`rl_config.max_consecutive_skipped_updates` in a row it stops with one error naming the step.

Checkpoints while a streak runs are deferred. A skipped update changes nothing (weights,
optimizer moments and LR schedule stay as they were), so such a checkpoint would hold the
streak's starting weights, finite, but it would move the resume point past batches never
trained on and, with `keep_last_n_checkpoints`, prune older checkpoints that may be the only
good ones. Deferred, the newest checkpoint stays the last one saved after an applied update;
the next due save after an applied update goes ahead as usual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mindrl.workers.skipped_updates import TRAINED_ROLES, consecutive_skipped_metric

LIMIT_KEY = "rl_config.max_consecutive_skipped_updates"


class NonFiniteTrainingError(RuntimeError):
    """Updates skipped in a row reached the limit: the run stops before saving or exporting."""

    def __init__(self, step: int, role: str, streak: int, limit: int) -> None:
        self.step, self.role, self.streak, self.limit = step, role, streak, limit
        super().__init__(
            f"step {step}: {streak} {role} updates in a row skipped for a non-finite loss or "
            f"grad norm ({LIMIT_KEY}={limit}); the run stops without a checkpoint of the "
            "streak or an HF export"
        )


@dataclass(frozen=True)
class SkippedUpdateStop:
    """`limit` updates skipped in a row stop the run; 0 turns the rule off (skip and go on,
    checkpoints saved as due)."""

    limit: int

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"{LIMIT_KEY} must be >= 0, got {self.limit}")

    @staticmethod
    def streaks(metrics: Mapping[str, float]) -> dict[str, int]:
        """Each trained role's updates skipped in a row, as the step's metrics report them."""
        out = {}
        for role in TRAINED_ROLES:
            key = consecutive_skipped_metric(role)
            if key in metrics:
                out[role] = int(metrics[key])
        return out

    def check(self, step: int, metrics: Mapping[str, float]) -> None:
        """Raise NonFiniteTrainingError when a role's streak reached the limit at `step`."""
        if self.limit == 0:
            return
        for role, streak in self.streaks(metrics).items():
            if streak >= self.limit:
                raise NonFiniteTrainingError(step, role, streak, self.limit)

    def defers_checkpoint(self, metrics: Mapping[str, float]) -> bool:
        """Whether a checkpoint due at this step waits: a streak is running (rule on)."""
        return self.limit > 0 and any(s > 0 for s in self.streaks(metrics).values())
