"""Roofline of a GRPO run: each model phase's measured seconds against the floor its
arithmetic sets at this machine's matmul rate, measured here, in the same invocation.

    python tools/bench/roofline.py --run-dir OUTPUT_DIR [--config-name NAME] [overrides ...]

The FLOPs come from `mindrl/planning/flops.py` (model shape x the step's real prompt and
response tokens, from metrics.jsonl; each prompt counted once for its n samples, as vLLM's
prefix caching and `share_prompt_forward` run it); the rate from torch matmuls of 2048 x
2048 at the run's training dtype on all cores (tools/bench/e2e.py: the mean of one
measurement right before the run and one right after). Per phase: floor seconds = FLOPs / rate, and
floor_fraction = floor / measured (1.0 would be matmul speed throughout; the rest is
overhead: padding, small kernels, communication, Python). Means over steps 2..N (step 1
warms caches). tools/bench/e2e.py adds the same table to each mindrl run it measures.
Prints JSON, then a summary line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MATMUL_SIZE = 2048


def matmul_gflops(dtype_name: str, seconds: float = 2.0, size: int = MATMUL_SIZE) -> float:
    """Measured GFLOP/s of square matmuls at `dtype_name` (fp32 / bf16) on all cores."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.matmul(a, b)  # warm-up: kernel selection, page faults
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        torch.matmul(a, b)
        done += 1
    return 2.0 * size**3 * done / elapsed / 1e9


def step_rows(metrics_path: Path) -> list[dict[str, Any]]:
    """Training records of a metrics.jsonl (records sharing a step merged), in step order."""
    from mindrl.trainer.metrics import merged_step_records

    return [r for r in merged_step_records(metrics_path) if r.get("timing/step") is not None]


def roofline(run: Any, rows: list[dict[str, Any]], gflops: float) -> dict[str, Any]:
    """Per phase over steps 2..N: measured seconds, floor seconds and their ratio. `run` is
    the run's RunConfig (model shape, samples per step, epochs, recompute, LoRA)."""
    from mindrl.planning.flops import StepTokens, phase_flops

    steady = rows[1:] or rows
    per_prompt = run.rl.algorithm.n_samples_per_prompt
    samples = run.train_prompts * per_prompt
    phases: dict[str, dict[str, float]] = {}
    for row in steady:
        tokens = StepTokens(
            samples, row["prompt_length/mean"], row["response_length/mean"], per_prompt
        )
        flops = phase_flops(
            run.actor.model,
            tokens,
            epochs=run.rl.algorithm.epochs,
            full_recompute=run.actor.memory.recompute_granularity == "full",
            frozen_base=run.actor.lora.enabled,
        )
        for name, value in flops.items():
            seconds = row.get(f"timing/{name}")
            if not seconds:  # a phase this run does not have (e.g. old_log_prob at 1 epoch)
                continue
            acc = phases.setdefault(name, {"gflop": 0.0, "measured_s": 0.0})
            acc["gflop"] += value / 1e9 / len(steady)
            acc["measured_s"] += seconds / len(steady)
    for acc in phases.values():
        acc["floor_s"] = acc["gflop"] / gflops
        acc["floor_fraction"] = acc["floor_s"] / acc["measured_s"]
    total_floor = sum(a["floor_s"] for a in phases.values())
    step_s = sum(r["timing/step"] for r in steady) / len(steady)
    return {
        "matmul_gflops": gflops,
        "phases": {k: {n: round(v, 4) for n, v in a.items()} for k, a in phases.items()},
        "step_s": round(step_s, 3),
        "step_floor_s": round(total_floor, 3),
        "step_floor_fraction": round(total_floor / step_s, 4),
    }


def measure(
    run: Any, rows: list[dict[str, Any]], before_gflops: float | None = None
) -> dict[str, Any]:
    """`roofline` at the matmul rate of the run's training dtype measured now, averaged with
    `before_gflops` (the same rate measured just before the run) where given: a cloud
    host's speed drifts over minutes, and one sample after a run of several minutes can land
    on either side of the speed the run had. Both samples are reported
    (`matmul_gflops_samples`), so their spread shows."""
    dtype = "bf16" if run.actor.precision.bf16 else "fp32"
    samples = [*([before_gflops] if before_gflops is not None else []), matmul_gflops(dtype)]
    table = roofline(run, rows, sum(samples) / len(samples))
    table["matmul_gflops_samples"] = [round(g, 1) for g in samples]
    table["dtype"] = dtype
    return table


def summary_line(name: str, table: dict[str, Any]) -> str:
    parts = [
        f"{phase} {p['floor_fraction']:.2f} ({p['measured_s']:.1f}s vs {p['floor_s']:.1f}s)"
        for phase, p in table["phases"].items()
    ]
    samples = table.get("matmul_gflops_samples", [])
    spread = (
        f" (before / after: {' / '.join(f'{g:.0f}' for g in samples)})" if len(samples) > 1 else ""
    )
    return (
        f"roofline {name}: step {table['step_floor_fraction']:.2f} of floor "
        f"at {table['matmul_gflops']:.0f} GFLOP/s{spread}; " + ", ".join(parts)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="holds metrics.jsonl")
    parser.add_argument("--config-name", help="default: the run's resolved_config.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)

    from mindrl.config import load_run_config

    if args.config_name:
        run = load_run_config(args.config_name, args.overrides, check_paths=False)[0]
    else:
        resolved = args.run_dir / "resolved_config.yaml"
        run = load_run_config(
            resolved.name, args.overrides, config_dir=resolved.parent, check_paths=False
        )[0]
    rows = step_rows(args.run_dir / "metrics.jsonl")
    if not rows:
        parser.error(f"no training steps in {args.run_dir / 'metrics.jsonl'}")
    table = measure(run, rows)
    print(json.dumps(table, indent=1))
    print(summary_line(args.run_dir.name, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
