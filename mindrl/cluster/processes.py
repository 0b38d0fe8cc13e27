"""Ending exactly the processes a run or a launch script started, by PID, never by name.

`stop_node` ends a node's Ray processes (the trees under the PIDs a script launched, the Ray
processes whose command line names the node's own `--temp-dir`, and the workers of those
raylets); `watch_driver` is the watchdog an embedded cluster starts so that a driver killed
with SIGKILL leaves nothing behind. `ray stop` is never used: it ends every Ray process of
the user on the machine, other people's clusters included.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Iterable

import psutil

_POLL_S = 1.0


def say(msg: str) -> None:
    """What the launch helpers report, on stdout (the launch scripts show it)."""
    print(f"[mindrl.launch] {msg}", flush=True)


# -- processes ------------------------------------------------------------------------------------


def _mentions_temp_dir(cmdline: list[str], temp_dir: str) -> bool:
    """The command line of a Ray process of the node that uses `temp_dir` as its root."""
    session = os.path.join(temp_dir, "session_")
    for i, arg in enumerate(cmdline):
        if session in arg or arg.endswith(f"--temp-dir={temp_dir}"):
            return True
        if arg in ("--temp-dir", "--temp_dir") and i + 1 < len(cmdline):
            if os.path.normpath(cmdline[i + 1]) == temp_dir:
                return True
    return False


def node_processes(temp_dir: str | None, roots: Iterable[int] = ()) -> list[psutil.Process]:
    """The processes of the node(s) a script started, never this process or its ancestors.

    The trees under `roots`; the processes whose command line names `temp_dir`'s sessions; and
    the Ray workers (`ray::...`, whose command line is rewritten) whose `RAY_RAYLET_PID` is one
    of the raylets found so far.
    """
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            found[root.pid] = root
            for child in root.children(recursive=True):
                found[child.pid] = child
    tdir = os.path.normpath(os.path.abspath(temp_dir)) if temp_dir else None
    everyone = list(psutil.process_iter(["pid", "cmdline", "name"]))
    if tdir:
        for proc in everyone:
            cmd = proc.info.get("cmdline") or []
            if proc.pid not in found and _mentions_temp_dir(cmd, tdir):
                found[proc.pid] = proc
    raylets = {str(p.pid) for p in found.values() if _is_raylet(p)}
    if raylets:
        for proc in everyone:
            if proc.pid in found:
                continue
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("RAY_RAYLET_PID") in raylets:
                    found[proc.pid] = proc
    mine = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        mine.update(p.pid for p in psutil.Process().parents())
    return sorted((p for pid, p in found.items() if pid not in mine), key=lambda p: p.pid)


def _is_raylet(proc: psutil.Process) -> bool:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    return bool(cmd) and os.path.basename(cmd[0]) == "raylet"


def stop_node(
    temp_dir: str | None, roots: list[int], grace_s: float = 15.0, record: str | None = None
) -> int:
    """SIGTERM the roots, then every other process found, SIGKILL what outlives `grace_s`.

    `ray start --block` ends its own children on SIGTERM; the sweep catches what it missed.
    The PIDs (with start times) go to `record` so a caller can check afterwards that all are gone.
    Exit status 0 when nothing is left.
    """
    procs = node_processes(temp_dir, roots)
    if record:
        rows = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rows.append(f"{p.pid} {p.create_time():.3f} {' '.join(p.cmdline())[:160]}")
        with open(record, "a", encoding="utf-8") as fh:
            fh.write("".join(row + "\n" for row in rows))
    if not procs:
        say("nothing to stop")
        return 0
    first = [p for p in procs if p.pid in set(roots)]
    _signal(first, signal.SIGTERM)
    alive = _wait_gone(first, grace_s)
    rest = [p for p in procs if p not in first and not _gone(p)]
    _signal(rest, signal.SIGTERM)
    stubborn = alive + _wait_gone(rest, min(grace_s, 5.0))
    _signal(stubborn, signal.SIGKILL)
    left = _wait_gone(stubborn, 5.0)
    say(
        f"stopped {len(procs)} process(es)"
        + (f", {len(stubborn)} with SIGKILL" if stubborn else "")
        + (f"; still alive: {[p.pid for p in left]}" if left else "")
    )
    return 1 if left else 0


def _gone(proc: psutil.Process) -> bool:
    """Exited (a zombie waiting for its parent to reap it counts as exited)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited or `timeout_s` passed; those still running."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in procs if not _gone(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if not _gone(p)]
    return left


def _signal(procs: Iterable[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)  # psutil refuses a PID that was reused by another process


# -- watchdog -------------------------------------------------------------------------------------

WATCHDOG_STOP = b"stop\n"


def _running(proc: psutil.Process) -> bool:
    """Still running (psutil compares the start time, so a reused PID is not mistaken)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _descendants(procs: Iterable[psutil.Process], exclude: set[int]) -> dict[int, psutil.Process]:
    """`procs` still running plus all their running descendants, minus the PIDs in `exclude`."""
    found: dict[int, psutil.Process] = {}
    for proc in procs:
        if not _running(proc):
            continue
        found.setdefault(proc.pid, proc)
        with contextlib.suppress(psutil.Error):
            for child in proc.children(recursive=True):
                found.setdefault(child.pid, child)
    return {pid: p for pid, p in found.items() if pid not in exclude}


def end_process_tree(
    procs: Iterable[psutil.Process], grace_s: float, exclude: set[int] | None = None
) -> list[psutil.Process]:
    """SIGTERM `procs` and their descendants, SIGKILL what is still there after `grace_s`.

    Returns the processes that were signalled. PIDs in `exclude` are never touched.
    """
    skip = set(exclude or ()) | {os.getpid()}
    targets = _descendants(procs, skip)
    _signal(targets.values(), signal.SIGTERM)
    _wait_gone(list(targets.values()), grace_s)
    # children forked meanwhile, and whatever ignored SIGTERM
    late = _descendants(targets.values(), skip)
    _signal(late.values(), signal.SIGKILL)
    _wait_gone(list(late.values()), 2.0)
    return list({**targets, **late}.values())


def watch_driver(
    pid: int,
    grace_s: float = 2.0,
    poll_s: float = 0.25,
    snapshot_s: float = 1.0,
    stop_fd: int | None = None,
) -> int:
    """Watch driver `pid`; when it is gone, end the processes it had started, by PID.

    The driver's process tree is recorded every `snapshot_s` while it lives (Ray re-parents
    nothing while the driver is up; after a SIGKILL its agents are orphans, found only through
    this record). `stop_fd` (default stdin) is a pipe from the driver: "stop" there means a
    clean shutdown, so nothing is touched. Death is noticed within `poll_s` (EOF on the pipe
    or the PID gone); everything is over within about `grace_s` + 2 s after that.
    """
    try:
        driver = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    me = os.getpid()
    fd = sys.stdin.fileno() if stop_fd is None else stop_fd
    pipe_open = True
    seen: dict[int, psutil.Process] = {}
    next_snapshot = 0.0
    while True:
        if time.monotonic() >= next_snapshot:
            seen = {pid: p for pid, p in seen.items() if _running(p)}  # orphans stay
            with contextlib.suppress(psutil.Error):
                for child in driver.children(recursive=True):
                    if child.pid != me:
                        seen.setdefault(child.pid, child)
            next_snapshot = time.monotonic() + snapshot_s
        if pipe_open:
            ready, _, _ = select.select([fd], [], [], poll_s)
            if ready:
                data = os.read(fd, 4096)
                if WATCHDOG_STOP.strip() in data:
                    return 0
                if not data:
                    pipe_open = False  # the driver closed it: dead, or forked children hold it
        else:
            time.sleep(poll_s)
        if not _running(driver):
            break
    left = [p for p in seen.values() if _running(p)]
    if not left:
        return 0
    stopped = end_process_tree(left, grace_s, exclude={me})
    print(
        f"[mindrl.watchdog] driver pid {pid} is gone: stopped {len(stopped)} process(es) it "
        f"had started",
        file=sys.stderr,
        flush=True,
    )
    return 0
