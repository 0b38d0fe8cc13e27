"""A trained role's non-finite optimizer updates: those skipped over the whole run
(checkpointed) and those skipped in a row now (the streak the driver stops a run on).

The metric names live here, once, for the worker that counts and the driver that reads.
"""

from __future__ import annotations

from dataclasses import dataclass

TRAINED_ROLES = ("actor", "critic")


def skipped_updates_metric(role: str) -> str:
    """Updates of `role` skipped since the run's first step (resumes carry it on)."""
    return f"{role}/skipped_updates"


def consecutive_skipped_metric(role: str) -> str:
    """Updates of `role` skipped in a row, up to the end of this step (0: the last applied)."""
    return f"{role}/consecutive_skipped_updates"


@dataclass
class SkippedUpdates:
    """Counts skipped updates. A checkpoint records `total` only: with the stop rule on
    (`rl_config.max_consecutive_skipped_updates`) the driver defers saves while a streak
    runs, so every checkpoint it writes has a streak of 0."""

    total: int = 0
    streak: int = 0

    def skipped(self) -> None:
        self.total += 1
        self.streak += 1

    def applied(self) -> None:
        self.streak = 0

    def metrics(self, role: str) -> dict[str, float]:
        return {
            skipped_updates_metric(role): float(self.total),
            consecutive_skipped_metric(role): float(self.streak),
        }
