"""Worker processes that run verifier calls in parallel, each under a timeout, and survive
bad verifiers.

Why not `concurrent.futures.ProcessPoolExecutor`: a running task cannot be cancelled, so a
verifier that hangs holds its worker forever, and one worker that dies (os._exit, segfault)
breaks the executor and fails every pending future. Here each worker runs one call at a
time; the parent kills a worker whose call overruns its deadline, or replaces one that died,
and only that call is lost. Calls go to a worker in batches (one message, an answer per
call as it finishes; `_dispatch`): the calls of a killed worker's batch that had not started
go back to the queue. Within one `run` (one training step) a `StepGuard` stops a
broken verifier early: after a few costly failures in a row, or once the step budget is
spent, its remaining calls score 0 without running. So a verifier that hangs on every call
costs about one budget (2 x timeout by default) per step, not one timeout per sample.

Workers start through forkserver (or spawn), never plain fork: the trainer process holds
threads (Ray, torch) that fork would copy in an undefined state. Each worker leads its own
process group, so killing it also kills any children a verifier started, and it exits by
itself when the parent process dies (a "lifeline" pipe reaches EOF). The worker side
(memory cap, value checks) is in `mindrl.rewards.worker`, the process handling (process
groups, reaping) in `mindrl.rewards.worker_handle`.
"""

from __future__ import annotations

import collections
import logging
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext, SpawnContext
from pathlib import Path
from typing import Literal, NamedTuple, get_args

from mindrl.rewards.guard import BUDGET_EXHAUSTED, CIRCUIT_OPEN, StepGuard
from mindrl.rewards.types import RewardParams, SampleMeta
from mindrl.rewards.worker import (
    ERROR,
    INVALID,
    OK,
    SKIPPED,
    TIMEOUT,
    WorkerLimits,
    worker_main,
)
from mindrl.rewards.worker_handle import (
    WorkerHandle,
    kill_worker,
    preload_in_forkserver,
    shutdown,
)

__all__ = ["ERROR", "INVALID", "OK", "SKIPPED", "TIMEOUT", "Call", "Outcome", "PoolRun"]
__all__ += ["StartMethod", "VerifierPool", "default_num_workers"]

logger = logging.getLogger(__name__)

# how verifier processes start: never 'fork', unsafe in a threaded trainer
StartMethod = Literal["forkserver", "spawn"]
_MAX_STARTUP_FAILURES = 3
_MAX_AUTO_WORKERS = 16
_MAX_BATCH = 64  # calls sent to a worker at once


class Outcome(NamedTuple):
    status: str  # OK | TIMEOUT | ERROR | INVALID | SKIPPED
    value: float  # the verifier's value when OK, else 0.0
    detail: str = ""
    costly: bool = False  # it cost a timeout or a worker: what the circuit breaker counts


class PoolRun(NamedTuple):
    """What one `VerifierPool.run` (one step) produced."""

    outcomes: list[Outcome]  # one per call, in order
    open_circuits: frozenset[str]  # verifiers the circuit breaker stopped in this run
    budget_exhausted: bool  # calls were skipped or cut because the step budget ran out
    restarts: int  # workers replaced during this run


@dataclass(frozen=True)
class Call:
    """One verifier applied to one sample."""

    name: str
    response: str
    label: str
    meta: SampleMeta


def default_num_workers() -> int:
    """Workers for `verifier_parallel: 0`: one per usable CPU, within [2, 16].

    At least 2 so one hung call never blocks every other call; at most 16 because rule
    verifiers are short CPU-bound checks and each worker holds its own copy of the imports.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(2, min(cpus, _MAX_AUTO_WORKERS))


@dataclass
class _Step:
    """The calls of one `run` and where they are: queued, running (on a worker) or done.

    Calls queue per verifier and are dispatched round-robin over the verifiers, those that
    failed costly in this step last: a hanging verifier then holds workers only while no
    healthy call waits, and healthy verifiers finish early in the step.
    """

    calls: Sequence[Call]
    guard: StepGuard | None  # None while only waiting for workers (construction)
    queues: dict[str, collections.deque[int]] = field(default_factory=dict)
    outcomes: list[Outcome | None] = field(default_factory=list)
    restarts: int = 0
    _turn: int = 0

    @classmethod
    def of(cls, calls: Sequence[Call], guard: StepGuard) -> _Step:
        queues: dict[str, collections.deque[int]] = {}
        for index, call in enumerate(calls):
            queues.setdefault(call.name, collections.deque()).append(index)
        return cls(calls, guard, queues, [None] * len(calls))

    def queued(self) -> bool:
        return any(self.queues.values())

    def queued_count(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def next_calls(self, limit: int) -> list[int]:
        """The next calls to send one worker (call only while `queued()`): up to `limit` of
        one verifier, taking turns between verifiers; one at a time of a verifier that
        failed costly in this step, so the guard decides on each of its calls."""
        names = [name for name, queue in self.queues.items() if queue]
        healthy = [n for n in names if self.guard is None or not self.guard.broken(n)]
        turn = healthy or names
        name = turn[self._turn % len(turn)]
        self._turn += 1
        queue = self.queues[name]
        if not healthy:
            limit = 1
        return [queue.popleft() for _ in range(min(limit, len(queue)))]

    def requeue(self, indices: Sequence[int]) -> None:
        """Calls sent but never run go back to the front of their queues, in order."""
        for index in reversed(indices):
            self.queues[self.calls[index].name].appendleft(index)

    def finish(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        if self.guard is not None and outcome.status != SKIPPED:
            self.guard.record(self.calls[index].name, outcome.costly)


class VerifierPool:
    """`num_workers` processes that each hold the named verifiers, one call at a time.

    timeout_s: per call. step_budget_s: per `run` for verifiers that failed costly in it
    (default 2 x timeout_s). max_consecutive_failures: costly failures in a row that stop a
    verifier for the rest of a run (0: never). memory_mb / reward_bound: see WorkerLimits.
    """

    def __init__(
        self,
        names: Sequence[str],
        num_workers: int,
        timeout_s: float,
        params: RewardParams | None = None,
        verifier_files: Sequence[str | Path] = (),
        start_method: StartMethod = "forkserver",
        startup_timeout_s: float = 120.0,
        step_budget_s: float | None = None,
        max_consecutive_failures: int = 3,
        limits: WorkerLimits | None = None,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if step_budget_s is not None and not step_budget_s > 0:
            raise ValueError(f"step_budget_s must be > 0, got {step_budget_s}")
        if max_consecutive_failures < 0:
            raise ValueError(
                f"max_consecutive_failures must be >= 0, got {max_consecutive_failures}"
            )
        if start_method not in get_args(StartMethod):
            raise ValueError(
                f"start_method must be one of {get_args(StartMethod)}, got {start_method!r}"
            )
        self.names = tuple(names)
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.step_budget_s = float(step_budget_s) if step_budget_s else 2.0 * self.timeout_s
        self.max_consecutive_failures = max_consecutive_failures
        self.startup_timeout_s = float(startup_timeout_s)
        self.limits = limits if limits is not None else WorkerLimits()
        self._params = params if params is not None else RewardParams()
        self._files = tuple(str(Path(f).resolve()) for f in verifier_files)
        self._ctx: SpawnContext | ForkServerContext = (
            mp.get_context("spawn") if start_method == "spawn" else mp.get_context("forkserver")
        )
        if start_method == "forkserver":
            preload_in_forkserver(self._ctx)
        self._workers: list[WorkerHandle] = []
        self._startup_failures = 0
        self.restarts = 0  # workers replaced after a timeout or a crash, since construction
        self._closed = False
        self._finalizer = weakref.finalize(self, shutdown, self._workers)
        try:
            self._fill()
            self._pump(_Step([], None), wait_ready=True)
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
            target=worker_main,
            args=(child_conn, lifeline_r, self.names, self._files, self._params, self.limits),
            name="mindrl-verifier",
        )
        process.start()
        child_conn.close()  # keep only our ends, so a dead worker reads as EOF
        lifeline_r.close()
        deadline = time.monotonic() + self.startup_timeout_s
        self._workers.append(WorkerHandle(process, conn, lifeline_w, deadline))

    def _fill(self) -> None:
        while len(self._workers) < self.num_workers:
            self._start_worker()

    def _retire(self, worker: WorkerHandle, step: _Step, outcome: Outcome) -> None:
        """Kill `worker`; give its running call `outcome`, or count a failed start-up."""
        kill_worker(worker)
        self._workers.remove(worker)
        if worker.call is not None:
            running, *unstarted = worker.calls
            worker.calls.clear()
            step.requeue(unstarted)
            step.finish(running, outcome._replace(costly=True))
            self.restarts += 1
            step.restarts += 1
        elif not worker.ready:
            self._startup_failures += 1
            logger.warning("verifier worker %d failed to start: %s", worker.pid, outcome.detail)
            if self._startup_failures >= _MAX_STARTUP_FAILURES:
                raise RuntimeError(
                    f"verifier workers failed to start {self._startup_failures} times in a "
                    f"row; last: {outcome.detail}"
                )

    # -- running calls

    def run(self, calls: Sequence[Call]) -> PoolRun:
        """Outcome of every call, in order. Returns once each call finished, timed out or
        was skipped by the step's guard (circuit breaker, budget)."""
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        guard = StepGuard(self.max_consecutive_failures, self.step_budget_s, time.monotonic())
        step = _Step.of(calls, guard)
        try:
            self._pump(step)
        except BaseException:  # e.g. KeyboardInterrupt: no stale result may reach a later run
            for worker in [w for w in self._workers if w.call is not None]:
                kill_worker(worker)
                self._workers.remove(worker)
            raise
        outcomes = [o if o is not None else Outcome(ERROR, 0.0, "lost") for o in step.outcomes]
        return PoolRun(outcomes, frozenset(guard.open_circuits), guard.budget_used, step.restarts)

    def _pump(self, step: _Step, wait_ready: bool = False) -> None:
        """Dispatch and collect until the queue is empty and no call runs.

        Replacement workers start in the background: a run does not wait for them unless
        it has calls left and no ready worker (or `wait_ready`, used at construction).
        """
        while True:
            self._fill()
            self._skip_blocked(step)
            idle = [w for w in self._workers if w.ready and w.call is None]
            for left, worker in zip(range(len(idle), 0, -1), idle):
                if step.queued():  # an even share of what is queued for each idle worker
                    self._dispatch(worker, step, -(-step.queued_count() // left))
            busy = [w for w in self._workers if w.call is not None or not w.ready]
            running = any(w.call is not None for w in busy)
            if not step.queued() and not running and (not wait_ready or not busy):
                return
            now = time.monotonic()
            wakeup = min((self._deadline(w, step) for w in busy), default=math.inf)
            if step.guard is not None:
                wakeup = min(wakeup, step.guard.next_wakeup(now))
            wait_s = max(0.0, wakeup - now) if wakeup < math.inf else None
            handles = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
            mp_connection.wait(handles, wait_s)
            for worker in list(self._workers):
                self._collect(worker, step)
            self._cut_overdue(step)

    def _deadline(self, worker: WorkerHandle, step: _Step) -> float:
        """When `worker` is cut: start-up limit, the call's timeout, or the step budget."""
        if worker.call is None or step.guard is None:
            return worker.deadline
        return step.guard.call_deadline(step.calls[worker.call].name, worker.deadline)

    def _skip_blocked(self, step: _Step) -> None:
        """Score 0 (SKIPPED) the queued calls the guard no longer lets run."""
        guard, now = step.guard, time.monotonic()
        if guard is None or not guard.any_blocked(now):
            return
        for name, queue in step.queues.items():
            reason = guard.blocked(name, now) if queue else None
            if reason is None:
                continue
            guard.budget_used |= reason == BUDGET_EXHAUSTED
            while queue:
                step.finish(queue.popleft(), Outcome(SKIPPED, 0.0, f"not run: {reason}"))

    def _cut_overdue(self, step: _Step) -> None:
        """Kill workers whose start-up or call ran past its deadline."""
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.call is None and worker.ready:
                continue
            deadline = self._deadline(worker, step)
            if deadline > now:
                continue
            name = step.calls[worker.call].name if worker.call is not None else ""
            if worker.call is None:
                detail = "start-up exceeded its time limit; worker killed"
            elif step.guard is not None and name in step.guard.open_circuits:
                detail = f"cut: {CIRCUIT_OPEN}; worker killed"
            elif deadline < worker.deadline:
                detail = f"cut: {BUDGET_EXHAUSTED}; worker killed"
                assert step.guard is not None
                step.guard.budget_used = True
            else:
                detail = f"call exceeded its {self.timeout_s:g} s timeout; worker killed"
            self._retire(worker, step, Outcome(TIMEOUT, 0.0, detail))

    def _dispatch(self, worker: WorkerHandle, step: _Step, share: int) -> None:
        """Send `worker` a batch of up to `share` calls (at most _MAX_BATCH): it runs them one
        after another and answers each as it finishes, so a step's calls cost one message
        to a worker, not a round trip each. Each call still has its own timeout: the next
        one's starts when the previous answer arrives."""
        indices = step.next_calls(max(1, min(share, _MAX_BATCH)))
        batch = [(i, c.name, c.response, c.label, c.meta) for i in indices for c in [step.calls[i]]]
        try:
            worker.conn.send(batch)
        except OSError:  # the worker died between calls: retry the calls elsewhere
            step.requeue(indices)
            self._retire(worker, step, Outcome(ERROR, 0.0, "worker died while idle"))
            return
        worker.calls.extend(indices)
        worker.deadline = time.monotonic() + self.timeout_s

    def _collect(self, worker: WorkerHandle, step: _Step) -> None:
        """Read what `worker` sent; retire it if it died or asked to be replaced."""
        exited = worker.exited()  # before reading, so a last message is not missed
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "ready":
                    worker.ready = True
                    worker.deadline = math.inf
                    self._startup_failures = 0
                elif message[0] == "failed":
                    self._retire(worker, step, Outcome(ERROR, 0.0, message[1]))
                    return
                else:
                    index, status, value, detail, fatal = message
                    if index != worker.call:
                        raise RuntimeError(f"verifier worker answered call {index} out of turn")
                    if fatal:  # e.g. MemoryError: the worker exits, its call costs a restart
                        self._retire(worker, step, Outcome(status, value, detail))
                        return
                    worker.calls.popleft()
                    step.finish(index, Outcome(status, value, detail))
                    # the next call of its batch starts now
                    worker.deadline = (
                        time.monotonic() + self.timeout_s if worker.calls else math.inf
                    )
        except (EOFError, OSError):
            exited = True
        if exited:
            kill_worker(worker)  # its children too; reaps it, so the exit code is known
            code = worker.process.exitcode
            self._retire(worker, step, Outcome(ERROR, 0.0, f"worker died (exit code {code})"))
