"""Errors a worker group raises instead of hanging: each names the role, the rank and why."""

from __future__ import annotations


class WorkerGroupError(RuntimeError):
    """Base class: something went wrong with the Ray workers of one role."""


class WorkerFailure(WorkerGroupError):
    """A worker's actor died (process killed, node lost, constructor failed)."""

    def __init__(self, role: str, rank: int, reason: str, method: str | None = None):
        self.role, self.rank, self.reason, self.method = role, rank, reason, method
        during = f" during {method}()" if method else ""
        super().__init__(f"{role} worker rank {rank} died{during}: {reason}")


class WorkerCallError(WorkerGroupError):
    """A worker's method raised; the actor is still alive. `reason` holds the remote traceback."""

    def __init__(self, role: str, rank: int, method: str, reason: str):
        self.role, self.rank, self.method, self.reason = role, rank, method, reason
        super().__init__(f"{role} worker rank {rank}: {method}() raised:\n{reason}")


class WorkerTimeout(WorkerGroupError):
    """A call did not finish within its time budget (the first rank still pending is named)."""

    def __init__(
        self,
        role: str,
        rank: int,
        method: str,
        timeout: float,
        pending_ranks: tuple[int, ...] = (),
        hint: str = "",
    ):
        self.role, self.rank, self.method, self.timeout = role, rank, method, timeout
        self.pending_ranks = pending_ranks or (rank,)
        ranks = ", ".join(str(r) for r in self.pending_ranks)
        msg = f"{role} worker rank {rank}: {method}() did not finish within {timeout:g} s"
        msg += f" (ranks still pending: {ranks})"
        super().__init__(msg + (f"; {hint}" if hint else ""))


class PlacementGroupTimeout(WorkerGroupError):
    """A placement group could not be reserved in time (the cluster lacks the resources)."""
