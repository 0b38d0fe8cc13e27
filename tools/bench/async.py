"""Benchmark: the one-step-off pipeline against synchronous steps, rollout on its own devices.

    python tools/bench/async.py [--steps 12] [--config-name grpo_tiny_cpu]
                                [--out bench/results/async.json] [--work-dir DIR]

Runs `cli/train_grpo.py` twice, one after the other, each in a fresh process tree, same seed
and data, with the rollout engine in a group of its own (`rl_config.rollout_resource`):
  sync      rollout_staleness 0: generate, then score, reference, update, weight sync
  one_off   rollout_staleness 1: the next step's generation runs beside this step's training

Per run (tools/bench/training_run.py's measurement): seconds per step over steps 2..N, each phase's
mean, peak summed PSS, machine load; for one_off also the seconds the driver waited for the
generation in flight and the share of the generation that ran behind training
(`timing/overlap`). On a 2-core machine both groups share the same two cores, so the overlap
cannot shorten the step much: docs/benchmarks.md's model says what it gives where rollout and
training have devices of their own. Writes bench/results/async.json; the last line is the
summary.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.bench.training_run import run_line  # noqa: E402

PIPELINE_KEYS = (
    "rollout/staleness",
    "timing/rollout_wait",
    "timing/rollout_hidden",
    "timing/overlap",
)


def variant_overrides(staleness: int) -> list[str]:
    return ["rl_config.rollout_resource.num_npus=1", f"rl_config.rollout_staleness={staleness}"]


def pipeline_means(out_dir: Path) -> dict[str, float]:
    """Means over steps 2..N of the pipeline's metrics (absent in the synchronous run)."""
    from mindrl.trainer.metrics import merged_step_records

    records = [r for r in merged_step_records(out_dir / "metrics.jsonl") if "timing/step" in r]
    steady = records[1:] or records
    out = {}
    for key in PIPELINE_KEYS:
        values = [r[key] for r in steady if key in r]
        if values:
            out[key] = sum(values) / len(values)
    return out


def expected_speedup(rollout: float, train: float, sync: float) -> float:
    """A step's time synchronous over one step off, rollout and training on devices of their
    own: (rollout + train + sync) / (max(rollout, train) + sync)."""
    return (rollout + train + sync) / (max(rollout, train) + sync)


def summary_line(results: dict[str, dict]) -> str:
    sync, off = results["sync"]["summary"], results["one_off"]["summary"]
    pipe = results["one_off"]["pipeline"]
    return (
        f"async: step_time sync={sync['s_per_step']:.2f}s one_off={off['s_per_step']:.2f}s "
        f"(x{off['s_per_step'] / sync['s_per_step']:.2f}) "
        f"staleness={pipe.get('rollout/staleness', float('nan')):.2f} "
        f"overlap={pipe.get('timing/overlap', float('nan')):.2f} "
        f"wait={pipe.get('timing/rollout_wait', float('nan')):.2f}s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--config-name", default="grpo_tiny_cpu")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "async.json")
    parser.add_argument("--work-dir", type=Path, help="keep the runs' outputs here (else temp)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be at least 3 (step 1 is warm-up)")

    from tools.bench.variants import finish, run_variants

    load_start = os.getloadavg()
    results = run_variants(
        "async",
        args.config_name,
        args.steps,
        {"sync": variant_overrides(0), "one_off": variant_overrides(1)},
        args.work_dir,
        args.timeout_s,
        measure=lambda out_dir: {"pipeline": pipeline_means(out_dir)},
        describe=lambda res: f"{run_line(res)} {res['pipeline']}",
    )
    report = {"config_name": args.config_name, "steps": args.steps, "runs": results}
    return finish("async", args.out, report, load_start, summary_line)


if __name__ == "__main__":
    sys.exit(main())
