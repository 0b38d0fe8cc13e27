"""The verifier worker process: loads the verifiers once, then runs its calls one at a time.

Kept apart from the parent-side pool (`pool.py`) because this code runs in another process
under its own limits: a memory cap (RLIMIT_DATA) so a runaway verifier fails with
MemoryError instead of swapping the host, and a value check so a verifier's garbage
(non-numbers, NaN, 1e30) never reaches the advantages.
"""

from __future__ import annotations

import math
import multiprocessing.connection as mp_connection
import os
import resource
import signal
import threading
import traceback
from dataclasses import dataclass, replace
from typing import Any

from mindrl.rewards.types import RewardParams

OK, TIMEOUT, ERROR, INVALID, SKIPPED = "ok", "timeout", "error", "invalid", "skipped"


@dataclass(frozen=True)
class WorkerLimits:
    """What a worker enforces on every call.

    memory_mb: cap on the worker's data segment (heap and private mappings, RLIMIT_DATA),
    counted from zero, so it includes what a loaded worker's imports already hold (hence
    `config.rl.MIN_VERIFIER_MEMORY_MB`); 0 = none.
    reward_bound: values with |v| above it are invalid (a 1e30 would swamp every advantage).
    The defaults are `rl_config.verifier_memory_mb` / `verifier_reward_bound`'s.
    """

    memory_mb: int = 2048
    reward_bound: float = 1e4

    def __post_init__(self) -> None:
        if self.memory_mb < 0:
            raise ValueError(f"memory_mb must be >= 0, got {self.memory_mb}")
        if not self.reward_bound > 0:
            raise ValueError(f"reward_bound must be > 0, got {self.reward_bound}")


def check_value(value: Any, bound: float = math.inf) -> tuple[str, float, str]:
    """A verifier's return value as (status, float, detail): finite numbers within bound."""
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        return INVALID, 0.0, f"returned {type(value).__name__}: {value!r:.100}"
    try:
        number = float(value)
    except Exception as exc:  # e.g. a multi-element tensor
        return INVALID, 0.0, f"returned {type(value).__name__} not convertible to float: {exc}"
    if not math.isfinite(number):
        return INVALID, 0.0, f"returned non-finite {number}"
    if abs(number) > bound:
        return INVALID, 0.0, f"returned {number:g}, beyond the reward bound {bound:g}"
    return OK, number, ""


def data_size_mb() -> int:
    """This process's data segment (VmData: what RLIMIT_DATA counts), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) // 1024
    return 0


def limit_memory(memory_mb: int) -> None:
    """Cap the data segment of this process and of any child a verifier starts.

    The hard limit goes down too, so a verifier cannot raise its own cap back. Fails loudly
    when the loaded worker already holds more than the cap: every call would fail otherwise.
    """
    if memory_mb <= 0:
        return
    held = data_size_mb()
    if held >= memory_mb:
        raise MemoryError(
            f"verifier_memory_mb={memory_mb} is not above the {held} MB a loaded verifier "
            "worker already holds; raise it"
        )
    limit = memory_mb << 20
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _die_with_parent(lifeline: mp_connection.Connection) -> None:
    try:
        lifeline.recv()  # the parent never sends: this returns only by EOF
    except (EOFError, OSError):
        pass
    os._exit(1)


def worker_main(
    conn: mp_connection.Connection,
    lifeline: mp_connection.Connection,
    names: tuple[str, ...],
    verifier_files: tuple[str, ...],
    params: RewardParams,
    limits: WorkerLimits,
) -> None:
    """Entry point of a worker process; speaks the pool's protocol over `conn`.

    Sends ("ready", pid) or ("failed", traceback) once, then takes batches: lists of (index,
    name, response, label, meta) calls, run in order, each answered by one (index, status,
    value, detail, fatal) reply as it finishes. fatal means the worker is no longer
    trustworthy (MemoryError): it exits after replying (the parent re-queues the rest).
    """
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    threading.Thread(target=_die_with_parent, args=(lifeline,), daemon=True).start()
    try:
        from mindrl.rewards import extraction, registry

        for path in verifier_files:
            registry.load_verifier_file(path)
        functions = {name: registry.get_verifier(name) for name in names}
        extraction.warmup()  # pay math_verify's import now, not inside a timed call
        limit_memory(limits.memory_mb)
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
        for index, name, response, label, meta in message:
            fatal = False
            try:
                value = functions[name](response, label, replace(meta, params=params))
                status, number, detail = check_value(value, limits.reward_bound)
            except MemoryError as exc:
                status, number, detail = ERROR, 0.0, f"MemoryError: {exc}"[:500]
                fatal = True  # the heap may be half-built: start a fresh worker
            except BaseException as exc:  # SystemExit from a verifier is an error, not ours
                status, number, detail = ERROR, 0.0, f"{type(exc).__name__}: {exc}"[:500]
            try:
                conn.send((index, status, number, detail, fatal))
            except (BrokenPipeError, OSError):
                return
            if fatal:
                os._exit(1)
