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
    them once per process. Falls back to RSS where PSS is unavailable."""

    def __init__(self, pid: int, interval_s: float = 1.0):
        self.pid, self.interval_s = pid, interval_s
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
            sizes: dict[str, int] = {}
            try:
                for proc in [root, *root.children(recursive=True)]:
                    try:
                        sizes[f"{proc.name()}[{proc.pid}]"] = _footprint(proc)
                    except psutil.Error:
                        pass
            except psutil.Error:
                return
            total = sum(sizes.values())
            if total > self.peak:
                self.peak, self.at_peak = total, sizes
            self._stop.wait(self.interval_s)

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


def _footprint(proc: Any) -> int:
    try:
        return int(proc.memory_full_info().pss)
    except (AttributeError, NotImplementedError):
        return int(proc.memory_info().rss)


def run_tree(cmd: list[str], log: Path, timeout_s: float) -> MemoryPeak:
    """Run `cmd` (its own session, output to `log`); return the tree's peak PSS."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        memory = TreeMemory(proc.pid)
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
