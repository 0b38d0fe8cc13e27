"""A benchmarked command's process tree: run it, sample its peak memory (summed PSS).

Shared by the benches that compare whole runs (tools/bench/e2e.py, lora.py and what builds on
them): the footprint that counts is the tree's, Ray workers and engine processes included.
"""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass
class MemoryPeak:
    """A process tree's peak summed PSS and, at that moment, each process's share (by its
    name, e.g. Ray's `ray::ActorWorker.update`, and pid): where the peak is."""

    gib: float = 0.0
    by_process: dict[str, float] = field(default_factory=dict)


class TreeMemory:
    """Peak summed proportional set size (PSS) of a process and all its descendants, polled
    in a thread. PSS splits shared pages (Ray's object store, shared libraries) between the
    processes mapping them, so the sum is the tree's real footprint; summed RSS would count
    them once per process. Falls back to RSS where PSS is unavailable.

    Reading PSS is not free: the kernel walks each process's page tables under its memory map
    lock, which stalls the process's own page faults meanwhile (the actor's most). With
    `pss_gate_mib` a poll reads only each process's resident memory that is not file-backed or
    shared (RSS less `shared` from /proc/PID/statm, a cheap read), and PSS only when that sum
    has grown by the gate since the last PSS reading: PSS grows with it, so the peak is still
    read, and a run in its steady state is left alone (a short step is visibly slower under a
    PSS poll every second). The
    plain RSS sum would be a worse gate: shared pages counted once per process mapping them
    rise and fall with processes starting and ending, where PSS does not."""

    def __init__(self, pid: int, interval_s: float = 1.0, pss_gate_mib: float | None = None):
        self.pid, self.interval_s = pid, interval_s
        self.gate = None if pss_gate_mib is None else int(pss_gate_mib * 2**20)
        self.polls, self.pss_readings = 0, 0
        self._private_at_reading = -1
        self.peak, self.at_peak = 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            self.polls += 1
            if self._pss_due(procs):
                self._read_pss(procs)
            self._stop.wait(self.interval_s)

    def _pss_due(self, procs: list[Any]) -> bool:
        """Always without a gate; with one, when the summed private resident memory has grown
        by the gate."""
        if self.gate is None:
            return True
        private = sum(_private_resident(proc) for proc in procs)
        if private < self._private_at_reading + self.gate:
            return False
        self._private_at_reading = private
        return True

    def _read_pss(self, procs: list[Any]) -> None:
        import psutil

        sizes: dict[str, int] = {}
        for proc in procs:
            try:
                sizes[f"{proc.name()}[{proc.pid}]"] = _footprint(proc)
            except psutil.Error:
                pass
        self.pss_readings += 1
        total = sum(sizes.values())
        if total > self.peak:
            self.peak, self.at_peak = total, sizes

    def stop(self) -> MemoryPeak:
        self._stop.set()
        self._thread.join(timeout=5)
        ranked = sorted(self.at_peak.items(), key=lambda item: -item[1])
        return MemoryPeak(self.peak / 2**30, {k: round(v / 2**30, 3) for k, v in ranked})


def own_rss_mib() -> float:
    """This process's resident memory now (Linux VmRSS), MiB; NaN where it cannot be read."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _private_resident(proc: Any) -> int:
    import psutil

    try:
        info = proc.memory_info()
    except psutil.Error:
        return 0
    return int(info.rss - getattr(info, "shared", 0))


def _footprint(proc: Any) -> int:
    try:
        return int(proc.memory_full_info().pss)
    except (AttributeError, NotImplementedError):
        return int(proc.memory_info().rss)


def run_tree(
    cmd: list[str], log: Path, timeout_s: float, pss_gate_mib: float | None = None
) -> MemoryPeak:
    """Run `cmd` (its own session, output to `log`); return the tree's peak PSS (`TreeMemory`;
    with `pss_gate_mib` the gated reading, polled every 0.25 s)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        interval_s = 1.0 if pss_gate_mib is None else 0.25  # a gated poll is cheap: poll often
        memory = TreeMemory(proc.pid, interval_s=interval_s, pss_gate_mib=pss_gate_mib)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise SystemExit(f"{cmd[1]} ran past {timeout_s:.0f} s; log: {log}") from None
        finally:
            peak = memory.stop()
    if code != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"{' '.join(cmd[:3])} failed with exit code {code}:\n{tail}")
    return peak
