"""Parent-side handle of one verifier worker process: start it, poll it, kill it.

Kept apart from the scheduling in `pool.py`: these are the process-group and reaping rules
that make sure a killed worker takes the children a verifier started with it, and that a
pid is never signalled after it was reaped (it may belong to another process by then).
"""

from __future__ import annotations

import collections
import multiprocessing.connection as mp_connection
import os
import signal
import time
from typing import Any

PRELOAD_MODULE = "mindrl.rewards._preload"


class WorkerHandle:
    """A worker process, the parent's pipe ends to it, and the call it runs."""

    def __init__(
        self, process: Any, conn: mp_connection.Connection, lifeline: Any, deadline: float
    ):
        self.process = process
        self.pid: int = process.pid
        self.conn = conn
        self.lifeline = lifeline
        self.ready = False
        self.killed = False
        # the calls sent to it, in the order it runs them: the first is running
        self.calls: collections.deque[int] = collections.deque()
        self.deadline = deadline  # of the running call, or of start-up while not ready

    @property
    def call(self) -> int | None:
        """The call it is running, or None when idle."""
        return self.calls[0] if self.calls else None

    def exited(self) -> bool:
        """Whether the process ended; does not reap it, so its group id stays ours."""
        return bool(mp_connection.wait([self.process.sentinel], 0))


def kill_worker(worker: WorkerHandle) -> None:
    """SIGKILL the worker's process group (it and any children a verifier made), reap it.

    Only once per worker: after the reap its pid may belong to an unrelated process.
    """
    if worker.killed:
        return
    worker.killed = True
    try:
        if os.getpgid(worker.pid) == worker.pid:
            os.killpg(worker.pid, signal.SIGKILL)
        else:  # killed before it could call setpgid
            worker.process.kill()
    except (ProcessLookupError, PermissionError):
        pass
    worker.process.join(timeout=10)
    for end in (worker.conn, worker.lifeline):
        try:
            end.close()
        except OSError:
            pass


def shutdown(workers: list[WorkerHandle]) -> None:
    """Ask idle workers to exit, then kill whatever is left; used by close() and at exit."""
    pending = []
    for worker in workers:
        if worker.ready and worker.call is None and not worker.exited():
            try:
                worker.conn.send(None)
                pending.append(worker.process.sentinel)
            except OSError:
                pass
    deadline = time.monotonic() + 2.0
    while pending and time.monotonic() < deadline:
        done = mp_connection.wait(pending, max(0.0, deadline - time.monotonic()))
        pending = [s for s in pending if s not in done]
    for worker in workers:  # busy or stuck ones, and the children of any of them
        kill_worker(worker)
    workers.clear()


def preload_in_forkserver(ctx: Any) -> None:
    """Add our warm-up module to the forkserver's preload list (kept: whatever is there).

    Takes effect only if the forkserver has not started yet in this process; otherwise
    workers import the verifiers themselves, which only makes restarts slower.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    current = list(getattr(server, "_preload_modules", None) or ["__main__"])
    if PRELOAD_MODULE not in current:
        ctx.set_forkserver_preload([*current, PRELOAD_MODULE])
