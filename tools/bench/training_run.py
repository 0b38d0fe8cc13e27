"""One training run, measured: `cli/train_grpo.py` (or another trainer) in a fresh process
tree, its per-step timings and learning signals from metrics.jsonl, the tree's peak memory,
and how much of the machine it had meanwhile. tools/bench/variants.py runs several of
these; lora.py, packing.py, async.py and tools/compare_algorithms.py compare their results.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tools.bench.e2e import MINDRL_PHASES
from tools.bench.process_tree import run_tree

STEP_KEYS = {  # metrics.jsonl key -> per-step field kept beside the timings
    "grpo/score": "reward",
    "response_length/mean": "response_length",
    "actor/kl_loss": "kl_loss",
    "actor/entropy": "entropy",
    "grad_norm": "grad_norm",
}
TRAINABLE_RE = re.compile(r"trainable parameters: (\d+) of (\d+)")


def common_overrides(steps: int, out_dir: Path) -> list[str]:
    """Both runs: N steps into `out_dir`, no step checkpoints (nothing big written)."""
    return [
        f"megatron_training.train_iters={steps}",
        f"runtime.output_dir={out_dir}",
        "actor_config.save=null",
        "megatron_training.save_interval=0",
    ]


def train_command(
    config: str, overrides: list[str], script: str = "cli/train_grpo.py"
) -> list[str]:
    return [sys.executable, script, "--config-name", config, *overrides]


def parse_metrics(text: str) -> list[dict[str, Any]]:
    """metrics.jsonl -> one row per training step, in step order: wall seconds, every
    `timing/*` phase, reward and a few learning signals. Records sharing a step (validation
    lines) are merged; steps without `timing/step` (validation only) are dropped."""
    merged: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)
            merged.setdefault(int(record["step"]), {}).update(record)
    rows = []
    for step in sorted(merged):
        m = merged[step]
        if m.get("timing/step") is None:
            continue
        timings = {
            k.removeprefix("timing/"): float(v)
            for k, v in m.items()
            if k.startswith("timing/") and k != "timing/step" and v is not None
        }
        phases = {p: timings.get(p, 0.0) for p in MINDRL_PHASES}
        phases["other"] = float(m["timing/step"]) - sum(phases.values())
        detail = {k: v for k, v in timings.items() if k not in MINDRL_PHASES}
        row: dict[str, Any] = {
            "step": step,
            "time": m.get("time"),  # unix time the step was logged
            "step_time": float(m["timing/step"]),
        }
        row.update({field: m.get(key) for key, field in STEP_KEYS.items()})
        row["phases"], row["detail"] = phases, detail
        rows.append(row)
    return rows


def parse_trainable(log_text: str) -> tuple[int, int] | None:
    """(trainable, total) from the driver's `trainable parameters: N of M` line (LoRA only)."""
    match = TRAINABLE_RE.search(log_text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _mean(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in rows:
        for name, value in row[key].items():
            out[name] = out.get(name, 0.0) + value / len(rows)
    return {name: round(value, 3) for name, value in out.items()}


def summarize(steps: list[dict[str, Any]], peak_pss_gib: float) -> dict[str, Any]:
    """Means over steps 2..N (step 1 is warm-up; with one step, that step)."""
    steady = steps[1:] or steps
    rewards = [s["reward"] for s in steps]
    known = [r for r in rewards if r is not None]
    return {
        "s_per_step": sum(s["step_time"] for s in steady) / len(steady),
        "step1_s": steps[0]["step_time"],
        "phase_s": _mean(steady, "phases"),
        "detail_s": _mean(steady, "detail"),
        "rewards": rewards,
        "reward_mean": sum(known) / len(known) if known else None,
        "peak_pss_gib": peak_pss_gib,
    }


class Contention:
    """How much of the machine a run had, sampled in a thread while it runs: the 1-minute
    load average and the CPU seconds of the descendants this process starts after the meter
    (the run's tree; children already running, e.g. a test runner's, are not the run's; a
    process that exits keeps what it used up to its last sample). Over a window,
    cpu_share = tree CPU seconds / (wall seconds x cores): near 1 when the run has both
    cores, lower when other work takes them; CPU seconds per step are less sensitive to
    other work than wall seconds (not immune: shared caches, spinning waits)."""

    def __init__(self, interval_s: float = 5.0):
        import psutil

        self.interval_s = interval_s
        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        self.samples: list[tuple[float, float, float]] = []  # (unix time, load1, tree cpu s)
        self._cpu: dict[int, float] = {}
        self._start = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            for proc in me.children(recursive=True):
                if proc.pid in self._before:
                    continue
                try:
                    t = proc.cpu_times()
                    self._cpu[proc.pid] = t.user + t.system
                except psutil.Error:
                    pass
            self.samples.append((time.time(), os.getloadavg()[0], sum(self._cpu.values())))
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.window(self._start, time.time())

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """Load (mean, max) and tree CPU seconds between two unix times (CPU interpolated
        between samples)."""
        loads = [load for t, load, _ in self.samples if t0 <= t <= t1]
        cpu_s = self._cpu_at(t1) - self._cpu_at(t0)
        return {
            "load1_mean": sum(loads) / len(loads) if loads else float("nan"),
            "load1_max": max(loads, default=float("nan")),
            "tree_cpu_s": cpu_s,
            "cpu_share": cpu_s / max((t1 - t0) * (os.cpu_count() or 1), 1e-9),
        }

    def _cpu_at(self, t: float) -> float:
        before = [(ts, c) for ts, _, c in self.samples if ts <= t]
        after = [(ts, c) for ts, _, c in self.samples if ts > t]
        if not before:
            return 0.0
        (ta, ca) = before[-1]
        if not after:
            return ca
        (tb, cb) = after[0]
        return ca + (cb - ca) * (t - ta) / (tb - ta)


def run_one(
    name: str,
    config: str,
    overrides: list[str],
    out_dir: Path,
    timeout_s: float,
    script: str = "cli/train_grpo.py",
    pss_gate_mib: float | None = None,
) -> dict:
    """One training run (`script`) in its own process tree; its metrics, log line and peak
    memory (`pss_gate_mib`: `run_tree`'s gated reading)."""
    cmd = train_command(config, overrides, script)
    start = time.perf_counter()
    contention = Contention()
    try:
        log = out_dir.parent / f"{name}.log"
        peak = run_tree(cmd, log, timeout_s=timeout_s, pss_gate_mib=pss_gate_mib).gib
    finally:
        machine = contention.stop()
    wall = time.perf_counter() - start
    steps = parse_metrics((out_dir / "metrics.jsonl").read_text())
    if len(steps) > 1 and steps[0]["time"] and steps[-1]["time"]:
        # steps 2..N: from the moment step 1 was logged to the moment step N was
        steady = contention.window(steps[0]["time"], steps[-1]["time"])
        steady["cpu_s_per_step"] = steady["tree_cpu_s"] / (len(steps) - 1)
        machine["steady"] = steady
    driver_log = out_dir / "logs" / "driver.log"
    trainable = parse_trainable(driver_log.read_text()) if driver_log.exists() else None
    return {
        "command": cmd[1:],
        "process_wall_s": wall,
        "machine": machine,
        "trainable_params": trainable[0] if trainable else None,
        "total_params": trainable[1] if trainable else None,
        "steps": steps,
        "summary": summarize(steps, peak),
    }


def run_line(res: dict[str, Any]) -> str:
    """One run's progress line: its timings, memory, how busy the machine was, rewards."""
    s, m = res["summary"], res["machine"].get("steady", res["machine"])
    rewards = [None if r is None else round(r, 3) for r in s["rewards"]]
    return (
        f"{s['s_per_step']:.1f} s/step (step 1 {s['step1_s']:.1f} s), "
        f"{m.get('cpu_s_per_step', float('nan')):.1f} CPU s/step, "
        f"peak {s['peak_pss_gib']:.2f} GiB, phases {s['phase_s']}, "
        f"load {m['load1_mean']:.1f}, cpu share {m['cpu_share']:.2f}, rewards {rewards}"
    )
