"""Worker processes that run verifier calls with a per-call timeout and survive bad verifiers.

Why not `concurrent.futures.ProcessPoolExecutor`: a running task cannot be cancelled, so a
verifier that hangs holds its worker forever, and one worker that dies (os._exit, segfault)
breaks the executor and fails every pending future. Here each worker runs one call at a
time; the parent kills a worker whose call overruns its deadline, or replaces one that died,
and only that call is lost. Worst case for a batch: ceil(hung calls / workers) * timeout.

Workers start through forkserver (or spawn), never plain fork: the trainer process holds
threads (Ray, torch) that fork would copy in an undefined state. Each worker leads its own
process group, so killing it also kills any children a verifier started, and it exits by
itself when the parent process dies (a "lifeline" pipe reaches EOF).
"""

from __future__ import annotations

import collections
import logging
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from mindrl.rewards.types import RewardParams, SampleMeta

logger = logging.getLogger(__name__)

OK, TIMEOUT, ERROR, INVALID = "ok", "timeout", "error", "invalid"
_MAX_STARTUP_FAILURES = 3
_PRELOAD_MODULE = "mindrl.rewards._preload"


class Outcome(NamedTuple):
    status: str  # OK | TIMEOUT | ERROR | INVALID
    value: float  # the verifier's value when OK, else 0.0
    detail: str = ""


@dataclass(frozen=True)
class Call:
    """One verifier applied to one sample."""

    name: str
    response: str
    label: str
    meta: SampleMeta


# ---------------------------------------------------------------------------- worker side


def _check_value(value: Any) -> tuple[str, float, str]:
    """A verifier's return value as (status, float, detail): finite real numbers only."""
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        return INVALID, 0.0, f"returned {type(value).__name__}: {value!r:.100}"
    try:
        number = float(value)
    except Exception as exc:  # e.g. a multi-element tensor
        return INVALID, 0.0, f"returned {type(value).__name__} not convertible to float: {exc}"
    if not math.isfinite(number):
        return INVALID, 0.0, f"returned non-finite {number}"
    return OK, number, ""


def _die_with_parent(lifeline: mp_connection.Connection) -> None:
    try:
        lifeline.recv()  # the parent never sends: this returns only by EOF
    except (EOFError, OSError):
        pass
    os._exit(1)


def _worker_main(
    conn: mp_connection.Connection,
    lifeline: mp_connection.Connection,
    names: tuple[str, ...],
    verifier_files: tuple[str, ...],
    params: RewardParams,
) -> None:
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    threading.Thread(target=_die_with_parent, args=(lifeline,), daemon=True).start()
    try:
        from mindrl.rewards import extraction, registry

        for path in verifier_files:
            registry.load_verifier_file(path)
        functions = {name: registry.get_verifier(name) for name in names}
        extraction.warmup()  # pay math_verify's import now, not inside a timed call
    except BaseException:
        conn.send(("failed", traceback.format_exc(limit=6)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, name, response, label, meta = message
        try:
            value = functions[name](response, label, replace(meta, params=params))
            status, number, detail = _check_value(value)
        except BaseException as exc:  # SystemExit from a verifier is an error, not our exit
            status, number, detail = ERROR, 0.0, f"{type(exc).__name__}: {exc}"[:500]
        try:
            conn.send((index, status, number, detail))
        except (BrokenPipeError, OSError):
            return


# ---------------------------------------------------------------------------- parent side


class _Worker:
    def __init__(
        self, process: Any, conn: mp_connection.Connection, lifeline: Any, deadline: float
    ):
        self.process = process
        self.pid: int = process.pid
        self.conn = conn
        self.lifeline = lifeline
        self.ready = False
        self.killed = False
        self.call: int | None = None
        self.deadline = deadline  # of the running call, or of start-up while not ready

    def exited(self) -> bool:
        """Whether the process ended; does not reap it, so its group id stays ours."""
        return bool(mp_connection.wait([self.process.sentinel], 0))


def _kill_worker(worker: _Worker) -> None:
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


def _shutdown(workers: list[_Worker]) -> None:
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
        _kill_worker(worker)
    workers.clear()


def _preload_in_forkserver(ctx: Any) -> None:
    """Add our warm-up module to the forkserver's preload list (kept: whatever is there).

    Takes effect only if the forkserver has not started yet in this process; otherwise
    workers import the verifiers themselves, which only makes restarts slower.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    current = list(getattr(server, "_preload_modules", None) or ["__main__"])
    if _PRELOAD_MODULE not in current:
        ctx.set_forkserver_preload([*current, _PRELOAD_MODULE])


class VerifierPool:
    """`num_workers` processes that each hold the named verifiers, one call at a time."""

    def __init__(
        self,
        names: Sequence[str],
        num_workers: int,
        timeout_s: float,
        params: RewardParams | None = None,
        verifier_files: Sequence[str | Path] = (),
        start_method: str = "forkserver",
        startup_timeout_s: float = 120.0,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if start_method == "fork":
            raise ValueError("start_method 'fork' is unsafe in a threaded trainer; use forkserver")
        self.names = tuple(names)
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self._params = params if params is not None else RewardParams()
        self._files = tuple(str(Path(f).resolve()) for f in verifier_files)
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            _preload_in_forkserver(self._ctx)
        self._workers: list[_Worker] = []
        self._startup_failures = 0
        self.restarts = 0  # workers replaced after a timeout or a crash, since construction
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        try:
            self._fill()
            self._pump([], collections.deque(), wait_ready=True)
        except BaseException:
            self.close()
            raise

    # -- lifecycle

    def pids(self) -> list[int]:
        """Process ids of the current workers (for monitoring and tests)."""
        return [w.pid for w in self._workers]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_worker(self) -> None:
        conn, child_conn = self._ctx.Pipe(duplex=True)
        lifeline_r, lifeline_w = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, lifeline_r, self.names, self._files, self._params),
            name="mindrl-verifier",
        )
        process.start()
        child_conn.close()  # keep only our ends, so a dead worker reads as EOF
        lifeline_r.close()
        deadline = time.monotonic() + self.startup_timeout_s
        self._workers.append(_Worker(process, conn, lifeline_w, deadline))

    def _fill(self) -> None:
        while len(self._workers) < self.num_workers:
            self._start_worker()

    def _retire(self, worker: _Worker, outcomes: list[Outcome | None], outcome: Outcome) -> None:
        """Kill `worker`; give its running call `outcome`, or count a failed start-up."""
        _kill_worker(worker)
        self._workers.remove(worker)
        if worker.call is not None:
            outcomes[worker.call] = outcome
            self.restarts += 1
        elif not worker.ready:
            self._startup_failures += 1
            logger.warning("verifier worker %d failed to start: %s", worker.pid, outcome.detail)
            if self._startup_failures >= _MAX_STARTUP_FAILURES:
                raise RuntimeError(
                    f"verifier workers failed to start {self._startup_failures} times in a "
                    f"row; last: {outcome.detail}"
                )

    # -- running calls

    def run(self, calls: Sequence[Call]) -> list[Outcome]:
        """Outcome of every call, in order. Returns once each call finished or timed out."""
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        outcomes: list[Outcome | None] = [None] * len(calls)
        try:
            self._pump(calls, collections.deque(range(len(calls))), outcomes)
        except BaseException:  # e.g. KeyboardInterrupt: no stale result may reach a later run
            for worker in [w for w in self._workers if w.call is not None]:
                _kill_worker(worker)
                self._workers.remove(worker)
            raise
        return [o if o is not None else Outcome(ERROR, 0.0, "lost") for o in outcomes]

    def _pump(
        self,
        calls: Sequence[Call],
        queue: collections.deque[int],
        outcomes: list[Outcome | None] | None = None,
        wait_ready: bool = False,
    ) -> None:
        """Dispatch and collect until the queue is empty and no call runs.

        Replacement workers start in the background: a batch does not wait for them unless
        it has calls left and no ready worker (or `wait_ready`, used at construction).
        """
        outcomes = outcomes if outcomes is not None else []
        while True:
            self._fill()
            for worker in list(self._workers):
                if queue and worker.ready and worker.call is None:
                    self._dispatch(worker, calls, queue, outcomes)
            busy = [w for w in self._workers if w.call is not None or not w.ready]
            running = any(w.call is not None for w in busy)
            if not queue and not running and (not wait_ready or not busy):
                return
            wait_s = max(0.0, min(w.deadline for w in busy) - time.monotonic()) if busy else 0.0
            handles = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
            mp_connection.wait(handles, wait_s)
            for worker in list(self._workers):
                self._collect(worker, outcomes)
            now = time.monotonic()
            for worker in list(self._workers):
                if (worker.call is not None or not worker.ready) and worker.deadline <= now:
                    what = "call" if worker.call is not None else "start-up"
                    self._retire(
                        worker,
                        outcomes,
                        Outcome(TIMEOUT, 0.0, f"{what} exceeded its time limit; worker killed"),
                    )

    def _dispatch(
        self,
        worker: _Worker,
        calls: Sequence[Call],
        queue: collections.deque[int],
        outcomes: list[Outcome | None],
    ) -> None:
        index = queue.popleft()
        call = calls[index]
        try:
            worker.conn.send((index, call.name, call.response, call.label, call.meta))
        except OSError:  # the worker died between calls: retry the call elsewhere
            queue.appendleft(index)
            self._retire(worker, outcomes, Outcome(ERROR, 0.0, "worker died while idle"))
            return
        worker.call = index
        worker.deadline = time.monotonic() + self.timeout_s

    def _collect(self, worker: _Worker, outcomes: list[Outcome | None]) -> None:
        """Read what `worker` sent; retire it if it died."""
        exited = worker.exited()  # before reading, so a last message is not missed
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "ready":
                    worker.ready = True
                    worker.deadline = math.inf
                    self._startup_failures = 0
                elif message[0] == "failed":
                    self._retire(worker, outcomes, Outcome(ERROR, 0.0, message[1]))
                    return
                else:
                    index, status, value, detail = message
                    outcomes[index] = Outcome(status, value, detail)
                    worker.call = None
                    worker.deadline = math.inf
        except (EOFError, OSError):
            exited = True
        if exited:
            _kill_worker(worker)  # its children too; reaps it, so the exit code is known
            code = worker.process.exitcode
            self._retire(worker, outcomes, Outcome(ERROR, 0.0, f"worker died (exit code {code})"))
