"""Benchmark: LoRA against full fine-tuning on grpo_smollm2_cpu, same steps and seed.

    python tools/bench/lora.py [--steps 4] [--rank 16] [--alpha 32] [--lr 1e-4]
                               [--config-name grpo_smollm2_cpu] [--out bench/results/lora.json]
                               [--work-dir DIR]

Runs `cli/train_grpo.py` twice, one after the other, each in a fresh process tree:
  full  the config as shipped (every weight trained, a separate reference worker)
  lora  rank-r adapters on linear_qkv, linear_proj, linear_fc1 and linear_fc2 with the base
        frozen, the reference being the actor's own base with its adapters off
        (share_backbone on the integrated worker: no reference process, no second copy), at
        an adapter-sized learning rate

Neither run writes step checkpoints (`actor_config.save=null`); the merged HF export at the
end still lands in the run's temporary output folder (it is after the last step, so it does
not count in the step times). Per run: seconds per step over steps 2..N (step 1 warms the
engine and allocator caches), the mean seconds of every `timing/*` phase over the same steps,
the peak summed PSS of the whole process tree (Ray workers and vLLM included, sampled every
second by tools/bench/process_tree.py's TreeMemory), the trainable parameter count the
driver logs, the reward (`grpo/score`) of every step, and how busy the machine was meanwhile
(load average, the share of the cores the run's tree got): step times are only comparable
at similar load. A run that fails or times out is recorded with its error and the other
still runs. Writes bench/results/lora.json; the last line is the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.bench.e2e import MINDRL_PHASES  # noqa: E402
from tools.bench.process_tree import run_tree  # noqa: E402

LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
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


def lora_overrides(rank: int, alpha: int, lr: float) -> list[str]:
    """Adapters on every attention and MLP linear; the reference is the frozen base in the
    actor's processes, so the config's ref_config and reference resources are dropped."""
    return [
        f"megatron_training.lora_r={rank}",
        f"megatron_training.lora_alpha={alpha}",
        f"megatron_training.lora_target_modules=[{','.join(LORA_TARGETS)}]",
        f"actor_config.lr={lr}",
        "rl_config.use_integrated_worker=true",
        "rl_config.share_backbone=true",
        "~ref_config",
        "~rl_config.reference_resource",
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


def fill_full_params(results: dict[str, dict]) -> None:
    """Full fine-tuning logs no count: it trains every base weight, which is the LoRA run's
    total less its adapters (the same model, so derived rather than guessed)."""
    full, lora = results.get("full") or {}, results.get("lora") or {}
    if (
        "trainable_params" in full
        and full["trainable_params"] is None
        and lora.get("trainable_params")
    ):
        base = lora["total_params"] - lora["trainable_params"]
        full["trainable_params"] = full["total_params"] = base
        full["params_note"] = "derived: the LoRA run's total minus its adapters"


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


def summary_line(results: dict[str, dict]) -> str:
    """Wall seconds per step and peak memory, LoRA over full; then, when measured, the CPU
    seconds per step and the share of the cores each run had (how comparable the times are)."""
    full, lora = results["full"]["summary"], results["lora"]["summary"]
    t_full, t_lora = full["s_per_step"], lora["s_per_step"]
    m_full, m_lora = full["peak_pss_gib"], lora["peak_pss_gib"]
    line = (
        f"lora: step_time full={t_full:.1f}s lora={t_lora:.1f}s (x{t_lora / t_full:.2f}) "
        f"peak_pss full={m_full:.2f}GiB lora={m_lora:.2f}GiB (x{m_lora / m_full:.2f})"
    )
    steady = [results[n].get("machine", {}).get("steady") for n in ("full", "lora")]
    if all(steady):
        c_full, c_lora = (s["cpu_s_per_step"] for s in steady)
        share_full, share_lora = (s["cpu_share"] for s in steady)
        line += (
            f" cpu_s full={c_full:.1f} lora={c_lora:.1f} (x{c_lora / c_full:.2f})"
            f" cpu_share full={share_full:.2f} lora={share_lora:.2f}"
        )
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4, help="the LoRA run's learning rate")
    parser.add_argument("--config-name", default="grpo_smollm2_cpu")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "lora.json")
    parser.add_argument("--work-dir", type=Path, help="keep the runs' outputs here (else temp)")
    parser.add_argument(
        "--timeout-s", type=float, help="per run (default 900 + 900 x steps: a busy machine)"
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 is warm-up)")

    from tools.bench.variants import failed, run_variants, write_report

    load_start = os.getloadavg()
    results = run_variants(
        "lora",
        args.config_name,
        args.steps,
        {"full": [], "lora": lora_overrides(args.rank, args.alpha, args.lr)},
        args.work_dir,
        args.timeout_s or 900 + 900 * args.steps,
    )
    fill_full_params(results)
    report = {
        "config_name": args.config_name,
        "steps": args.steps,
        "lora": {"rank": args.rank, "alpha": args.alpha, "lr": args.lr, "targets": LORA_TARGETS},
        "runs": results,
    }
    write_report(args.out, report, load_start)
    if failed(results):
        print("lora: failed (see the runs' errors above)")
        return 1
    print(
        f"lora: trainable full={results['full']['trainable_params']} "
        f"lora={results['lora']['trainable_params']}"
    )
    print(summary_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
