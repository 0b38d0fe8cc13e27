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


class NodeLost(WorkerFailure):
    """A Ray node died (its raylet is gone) while it held workers of this run: the error names
    the node and every role rank it held, not only the rank whose call noticed."""

    def __init__(
        self,
        role: str,
        rank: int,
        node_ip: str,
        node_id: str,
        held: tuple[str, ...],
        reason: str,
        method: str | None = None,
    ):
        self.node_ip, self.node_id, self.held = node_ip, node_id, held
        during = f" during {method}()" if method else ""
        self.role, self.rank, self.reason, self.method = role, rank, reason, method
        RuntimeError.__init__(
            self,
            f"lost Ray node {node_ip} (node id {node_id}){during}: it held "
            f"{', '.join(held) or 'no worker of this run'}; {reason}",
        )
