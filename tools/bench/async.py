"""Benchmark: the rollout pipeline at staleness k = 0, 1, 2, 4 on a generation-heavy workload.

    python tools/bench/async.py [--steps 12] [--config-name grpo_tiny_cpu]
                                [--staleness 0 1 2 4] [--max-tokens 192]
                                [--out bench/results/async.json] [--work-dir DIR]

Runs `cli/train_grpo.py` once per staleness k, one after the other, each in a fresh process
tree, same seed and data, with the rollout engine in a group of its own
(`rl_config.rollout_resource`) and long responses (`sampling_config.max_tokens`, every
response generated to that length: `ignore_eos`), so rollout outweighs the update:
  k0   rollout_staleness 0: generate, then score, reference, update, weight sync
  k1   rollout_staleness 1: the next step's generation runs beside this step's training
  k2   rollout_staleness 2: the next two steps' batches in flight (samples up to 2 updates old)
  k4   rollout_staleness 4

Per run (tools/bench/training_run.py's measurement): seconds per step over steps 2..N, each
phase's mean, peak summed PSS, machine load, the reward of every step; from the run's
metrics: tokens per second (prompt and response tokens over step time, steps 2..N), the
trainer's idle fraction (the time it waited for samples over the step's; with k = 0 the
whole rollout), the mean and largest staleness, the share of the newest batch's generation
that ran behind training (`timing/overlap`). On a 2-core machine the groups share the same
two cores, so the overlap cannot shorten the step much: docs/benchmarks.md's model says what
it gives where rollout and training have devices of their own. Writes
bench/results/async.json; the last line is the summary (k = 2 against k = 0).
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
    "rollout/staleness_max",
    "timing/rollout_wait",
    "timing/rollout_hidden",
    "timing/overlap",
    "timing/trainer_wait_samples",
    "timing/rollout_wait_weights",
)


def variant_name(staleness: int) -> str:
    return f"k{staleness}"


def variant_overrides(staleness: int, max_tokens: int = 192) -> list[str]:
    """Rollout on its own device, long responses (generated to `max_tokens`), staleness k."""
    return [
        "rl_config.rollout_resource.num_npus=1",
        f"rl_config.rollout_staleness={staleness}",
        f"generate_config.sampling_config.max_tokens={max_tokens}",
        "generate_config.sampling_config.ignore_eos=true",
    ]


def pipeline_means(out_dir: Path) -> dict[str, float]:
    """Over steps 2..N: the means of the pipeline's metrics (absent at k = 0), tokens per
    second (all steps' tokens over all steps' time) and the trainer's idle fraction."""
    from mindrl.trainer.metrics import merged_step_records

    records = [r for r in merged_step_records(out_dir / "metrics.jsonl") if "timing/step" in r]
    steady = records[1:] or records
    out = {}
    for key in PIPELINE_KEYS:
        values = [r[key] for r in steady if key in r]
        if values:
            out[key] = sum(values) / len(values)
    step_s = sum(r["timing/step"] for r in steady)
    out["tokens_per_s"] = sum(r["e2e_tps"] * r["timing/step"] for r in steady) / step_s
    waited = sum(r.get("timing/trainer_wait_samples", r.get("timing/rollout", 0.0)) for r in steady)
    out["trainer_idle_fraction"] = waited / step_s
    return out


def expected_speedup(rollout: float, train: float, sync: float) -> float:
    """A step's time synchronous over one step off, rollout and training on devices of their
    own: (rollout + train + sync) / (max(rollout, train) + sync)."""
    return (rollout + train + sync) / (max(rollout, train) + sync)


def summary_line(results: dict[str, dict]) -> str:
    base, two = results["k0"], results["k2"]
    base_tps, two_tps = base["pipeline"]["tokens_per_s"], two["pipeline"]["tokens_per_s"]
    return (
        f"async: k2 vs k0: tokens/s {two_tps:.1f} vs {base_tps:.1f} (x{two_tps / base_tps:.2f}), "
        f"step_time {two['summary']['s_per_step']:.2f}s vs {base['summary']['s_per_step']:.2f}s, "
        f"trainer idle {two['pipeline']['trainer_idle_fraction']:.2f} vs "
        f"{base['pipeline']['trainer_idle_fraction']:.2f}, "
        f"reward_mean {two['summary']['reward_mean']:.3f} vs {base['summary']['reward_mean']:.3f}"
    )


def describe(res: dict) -> str:
    pipe = res["pipeline"]
    return (
        f"{run_line(res)} tokens/s={pipe['tokens_per_s']:.1f} "
        f"idle={pipe['trainer_idle_fraction']:.2f} "
        f"staleness={pipe.get('rollout/staleness', 0.0):.2f} "
        f"rewards={[round(r, 3) for r in res['summary']['rewards'] if r is not None]}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--config-name", default="grpo_tiny_cpu")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=192,
        help="every response's length (192: the tiny config's max_model_len less its prompts)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "async.json")
    parser.add_argument("--work-dir", type=Path, help="keep the runs' outputs here (else temp)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be at least 3 (step 1 is warm-up)")
    if not {0, 2} <= set(args.staleness):
        parser.error("--staleness must include 0 and 2 (the summary compares them)")

    from tools.bench.variants import finish, run_variants

    load_start = os.getloadavg()
    results = run_variants(
        "async",
        args.config_name,
        args.steps,
        {variant_name(k): variant_overrides(k, args.max_tokens) for k in args.staleness},
        args.work_dir,
        args.timeout_s,
        measure=lambda out_dir: {"pipeline": pipeline_means(out_dir)},
        describe=describe,
    )
    report = {
        "config_name": args.config_name,
        "steps": args.steps,
        "max_tokens": args.max_tokens,
        "runs": results,
    }
    return finish("async", args.out, report, load_start, summary_line)


if __name__ == "__main__":
    sys.exit(main())
