"""Per-step rules that stop one broken verifier from stalling a whole step.

A verifier call that hangs costs a full timeout and one that kills its worker costs a
restart; with 64 samples that is 64 of them. Two rules bound it, each per step:

* circuit breaker: after `max_consecutive_failures` costly failures (timeouts, lost workers)
  of a verifier in a row, its queued calls are skipped and its running calls cut (scored 0)
  for the rest of the step;
* step budget: once `budget_s` has passed since the step started, a verifier that had any
  costly failure in the step gets no new calls, and its running calls are cut.

Calls never started are "skipped"; running calls that are cut count as timeouts (they did
not finish in the time they were given).

Cheap failures (an exception raised and caught, an invalid value) are counted by the scorer
but do not trip either rule: they cost no time, and a verifier that raises on some inputs
still scores the others. A healthy verifier is never skipped, however slow the step.
"""

from __future__ import annotations

import math
from collections import Counter

CIRCUIT_OPEN = "circuit open"
BUDGET_EXHAUSTED = "step budget exhausted"


class StepGuard:
    """The breaker and budget state of one step (one `VerifierPool.run`)."""

    def __init__(self, max_consecutive_failures: int, budget_s: float, start: float):
        if max_consecutive_failures < 0:
            raise ValueError(
                f"max_consecutive_failures must be >= 0, got {max_consecutive_failures}"
            )
        if not budget_s > 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        self.max_consecutive_failures = max_consecutive_failures  # 0: the breaker never opens
        self.deadline = start + budget_s
        self.open_circuits: set[str] = set()
        self.budget_used = False  # a call was skipped or cut because of the budget
        self._streak: Counter[str] = Counter()
        self._costly: Counter[str] = Counter()

    def record(self, name: str, costly: bool) -> None:
        """A call of `name` finished: costly failures extend its streak, anything else ends it."""
        if not costly:
            self._streak[name] = 0
            return
        self._streak[name] += 1
        self._costly[name] += 1
        limit = self.max_consecutive_failures
        if limit and self._streak[name] >= limit:
            self.open_circuits.add(name)

    def broken(self, name: str) -> bool:
        """Whether `name` had a costly failure in this step (the budget applies to it)."""
        return self._costly[name] > 0

    def any_blocked(self, now: float) -> bool:
        """Cheap pre-check before scanning a queue with `blocked`."""
        return bool(self.open_circuits) or (now >= self.deadline and bool(+self._costly))

    def blocked(self, name: str, now: float) -> str | None:
        """Why a queued call of `name` must be skipped now, or None to run it."""
        if name in self.open_circuits:
            return CIRCUIT_OPEN
        if now >= self.deadline and self.broken(name):
            return BUDGET_EXHAUSTED
        return None

    def call_deadline(self, name: str, own_deadline: float) -> float:
        """When a running call of `name` is cut: now if its circuit is open, at the budget's
        end if it is broken, else at its own timeout."""
        if name in self.open_circuits:
            return -math.inf
        return min(own_deadline, self.deadline) if self.broken(name) else own_deadline

    def next_wakeup(self, now: float) -> float:
        """The budget's end while it lies ahead (queued calls may be skipped then), else inf."""
        return self.deadline if now < self.deadline else math.inf
