"""GRPO, DAPO and GSPO on grpo_smollm2_cpu's task, same steps and seed, scored on held-out
problems before and during training.

    python tools/compare_algorithms.py [--steps 40] [--val-every 10]
                                       [--algorithms grpo,dapo,gspo]
                                       [--out bench/results/algorithms.json] [--work-dir DIR]

Each algorithm is its shipped SmolLM2 config, run by its own command, one after the other in
a fresh process tree:
  grpo  cli/train_grpo.py --config-name grpo_smollm2_cpu   (group-normalised advantages, KL loss)
  dapo  cli/train_dapo.py --config-name dapo_smollm2_cpu   (no reference, clip-higher,
        token-level loss, overlong shaping, dynamic sampling on lenient_acc)
  gspo  cli/train_grpo.py --config-name gspo_smollm2_cpu   (sequence-level ratio and clip)
All train on the same prompt store with the config's seed (1234) and are validated on the
64 held-out problems of `${asset:smollm2_prompts_val}` (two three-digit terms; the training
store has one- and two-digit terms), greedy, and the table reads their lenient_acc accuracy
(`val/lenient_acc_rewards/mean`; DAPO's `val/score` adds its overlong shaping): before step 1
(`val_before_train`) and every `--val-every` steps. No step checkpoints are written.

Per run: the held-out accuracy at each validation, the training accuracy per step
(`lenient_acc_rewards/mean`; for DAPO the mean over every generated batch, filtered groups
included), response length, generation
batches per step (DAPO), seconds per step and the run's wall time. The machine's load is
recorded (wall times are only comparable at similar load). Writes the JSON report; the last
line is the summary: held-out before -> after per algorithm.

`--reuse NAME=DIR` takes an algorithm's earlier run (its output folder, e.g. a longer run of
the same command that was stopped) instead of running it again: its first `--steps` steps
and validations are the same numbers a run of `--steps` steps gives (constant learning rate,
data order by seed); its wall time is then the span of its logged records up to that step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Algorithm:
    script: str
    config: str


ALGORITHMS = {
    "grpo": Algorithm("cli/train_grpo.py", "grpo_smollm2_cpu"),
    "dapo": Algorithm("cli/train_dapo.py", "dapo_smollm2_cpu"),
    "gspo": Algorithm("cli/train_grpo.py", "gspo_smollm2_cpu"),
}
HELD_OUT = "${asset:smollm2_prompts_val}"
# accuracy, not val/score: DAPO's score includes its overlong shaping (-0.31 before training)
HELD_OUT_METRIC = "val/lenient_acc_rewards/mean"
TRAIN_METRIC = "lenient_acc_rewards/mean"  # on the training samples (grpo/score: + shaping)


def validation_overrides(val_every: int) -> list[str]:
    """Held-out scoring before training and every `val_every` steps."""
    return [
        f"rl_config.val_data_path={HELD_OUT}",
        "rl_config.val_before_train=true",
        f"rl_config.test_freq={val_every}",
    ]


def read_records(metrics_file: Path, last_step: int | None = None) -> dict[int, dict[str, Any]]:
    """metrics.jsonl -> {step: merged record} (validation lines share their step's), up to
    `last_step` when given."""
    merged: dict[int, dict[str, Any]] = {}
    for line in metrics_file.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            step = int(record["step"])
            if last_step is None or step <= last_step:
                merged.setdefault(step, {}).update(record)
    return merged


def reuse_run(out_dir: Path, steps: int, val_every: int) -> dict[str, Any]:
    """An earlier run's first `steps` steps, which must include the validation at `steps`."""
    records = read_records(out_dir / "metrics.jsonl", steps)
    if HELD_OUT_METRIC not in records.get(steps, {}):
        raise SystemExit(f"{out_dir}: no validation at step {steps} in its metrics.jsonl")
    times = [r["time"] for r in records.values() if r.get("time")]
    wall = max(times) - min(times) if times else float("nan")
    return {"reused": str(out_dir), **describe_run(records, val_every, wall)}


def held_out_curve(records: dict[int, dict[str, Any]]) -> dict[int, float]:
    """{step: held-out accuracy}; step 0 is before training."""
    return {
        step: float(r[HELD_OUT_METRIC])
        for step, r in sorted(records.items())
        if HELD_OUT_METRIC in r
    }


def step_series(records: dict[int, dict[str, Any]], key: str) -> list[float | None]:
    """`key` at every training step (steps with `timing/step`), in order."""
    return [r.get(key) for _, r in sorted(records.items()) if r.get("timing/step") is not None]


def window_means(values: list[float | None], width: int) -> list[float | None]:
    """Means of consecutive `width`-step windows (None where a window has no value)."""
    out: list[float | None] = []
    for i in range(0, len(values), width):
        known = [v for v in values[i : i + width] if v is not None]
        out.append(round(sum(known) / len(known), 3) if known else None)
    return out


def describe_run(
    records: dict[int, dict[str, Any]], val_every: int, wall_s: float
) -> dict[str, Any]:
    """What the table needs from one run's metrics."""
    curve = held_out_curve(records)
    steps = step_series(records, "timing/step")
    rewards = step_series(records, TRAIN_METRIC)
    return {
        "held_out": curve,
        "held_out_before": curve.get(0),
        "held_out_after": curve[max(curve)] if curve and max(curve) > 0 else None,
        "train_reward": rewards,
        "train_reward_windows": window_means(rewards, val_every),
        "response_length_windows": window_means(
            step_series(records, "response_length/mean"), val_every
        ),
        "gen_batches": step_series(records, "train/num_gen_batches"),
        "steps_run": len(steps),
        "s_per_step": sum(steps) / len(steps) if steps else None,
        "wall_s": wall_s,
    }


def run_algorithm(
    name: str, steps: int, val_every: int, work: Path, timeout_s: float
) -> dict[str, Any]:
    from tools.bench.training_run import common_overrides, run_one

    algo = ALGORITHMS[name]
    out_dir = work / name
    overrides = common_overrides(steps, out_dir) + validation_overrides(val_every)
    res = run_one(name, algo.config, overrides, out_dir, timeout_s, script=algo.script)
    described = describe_run(
        read_records(out_dir / "metrics.jsonl"), val_every, res["process_wall_s"]
    )
    return {"command": res["command"], "machine": res["machine"], **described}


def run_line(name: str, r: dict[str, Any]) -> str:
    line = (
        f"{name}: held-out {r['held_out']}, train reward per {len(r['train_reward_windows'])} "
        f"windows {r['train_reward_windows']}, {r['s_per_step']:.1f} s/step, "
        f"wall {r['wall_s'] / 60:.1f} min"
    )
    if "machine" in r:
        line += f", load {r['machine']['load1_mean']:.1f}"
    return line


def _score(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"


def summary_line(results: dict[str, dict[str, Any]]) -> str:
    parts = []
    for name, r in results.items():
        if "error" in r:
            parts.append(f"{name}=failed")
        else:
            before, after = (_score(r[k]) for k in ("held_out_before", "held_out_after"))
            parts.append(f"{name}={before}->{after}")
    return "algorithms: held_out " + " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "algorithms.json")
    parser.add_argument("--work-dir", type=Path, help="keep the runs' outputs here (else temp)")
    parser.add_argument(
        "--reuse",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="take NAME's earlier run from its output folder instead of running it",
    )
    parser.add_argument(
        "--timeout-s", type=float, help="per run (default 900 + 300 x steps: a busy machine)"
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.algorithms.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown:
        parser.error(f"unknown algorithm(s) {unknown}; choose from {sorted(ALGORITHMS)}")
    if args.steps < 1 or args.val_every < 1 or args.steps % args.val_every:
        parser.error("--steps must be a positive multiple of --val-every (the last step scores)")
    reuse = dict(item.split("=", 1) for item in args.reuse if "=" in item)
    if len(reuse) != len(args.reuse) or not set(reuse) <= set(names):
        parser.error(f"--reuse takes NAME=DIR with NAME among {names}")

    import tempfile

    from tools.bench.variants import failed, write_report

    load_start = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mindrl-algorithms-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in names:
            verb = f"reading {reuse[name]} for" if name in reuse else "running"
            print(f"algorithms: {verb} {name} ({args.steps} steps) ...", flush=True)
            try:
                if name in reuse:
                    results[name] = reuse_run(Path(reuse[name]), args.steps, args.val_every)
                else:
                    results[name] = run_algorithm(
                        name,
                        args.steps,
                        args.val_every,
                        work,
                        args.timeout_s or 900 + 300 * args.steps,
                    )
            except SystemExit as exc:  # run_tree's failure or timeout: keep the other runs
                print(f"  {name}: FAILED: {exc}", flush=True)
                results[name] = {"error": str(exc)}
                continue
            print("  " + run_line(name, results[name]), flush=True)
    report = {"steps": args.steps, "val_every": args.val_every, "runs": results}
    write_report(args.out, report, load_start)
    print(summary_line(results))
    return 1 if failed(results) else 0


if __name__ == "__main__":
    sys.exit(main())
