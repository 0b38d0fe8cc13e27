"""Benchmark: the tiny run's steady-state step (#18: <= 0.25 s asked), as shipped and lean.

    python tools/bench/tiny_step.py [--steps 25] [--warmup 5]
                                    [--out bench/results/tiny_step.json] [--work-dir DIR]
                                    [--hf-rollout] [--repeats 1] [--profile]
                                    [--pss-every-second]

Runs `cli/train_grpo.py --config-name grpo_tiny_cpu` twice, one after the other, each in a
fresh process tree, same seed and data:
  shipped  the config as it ships, no overrides (packed micro-batches by token budget, each
           prompt once per micro-batch for its samples, the old policy's log-probs made by
           the update, vLLM's compiled mode; the reference in its own process)
  lean     the same with the reference as a weight snapshot in the actor's process (`LEAN`,
           the run's overrides, printed and in the JSON)

The tiny model's arithmetic is a few GFLOP a step, so its step time is fixed cost: engine
steps, per-operator work, Ray calls, the driver. Per run: the median over steps
warmup+1..N of `timing/step`, of each phase, and of the wall time between two steps'
metric rows (which adds the driver's logging after a step); peak summed PSS (read only when the
tree's private resident memory has grown by 16 MiB: a PSS reading every second, the other
benches' way, slows this short step visibly, since the kernel walks each process's page tables
under its memory map lock; `--pss-every-second` for that way); the score at
the first and last step (both runs must learn the task alike). The lean run is also given
as a ratio to the shipped one measured in the same invocation, and the host's fp32 matmul
rate is measured before and after the runs (the step follows the host's speed, which swings
between hosts and days). `--hf-rollout` adds a third run, the lean one with mindrl's HF
decode loop as the rollout backend (`LEAN_HF`): for a toy model vLLM's per-step cost is above
a plain loop's; it is reported beside the two, the verdict stays theirs. `--repeats R` runs
the variants R times in rounds (shipped, lean, ... then again), so a swing of the host falls
on every variant alike; each variant then reports the median over its rounds and their range
(one run's median moves between runs minutes apart on a small VM). `--profile`
adds one lean run whose last step mindrl's profiler captures (`profiler_config.integrated`):
per stage call its wall time, the time in torch operators, the work between them and the
operators with the most self time (`tools/bench/trace_summary.py`; JSON `profile`). Writes
bench/results/tiny_step.json; the last line is the summary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

CONFIG = "grpo_tiny_cpu"
TARGET_S = 0.25
PSS_GATE_MIB = 16.0
# what the lean run adds to the shipped config (which packs, shares prompts, makes the old
# log-probs in the update and compiles vLLM itself): the reference in the actor's processes
LEAN = [
    "rl_config.use_integrated_worker=true",
    "+rl_config.reference_in_actor=true",
    "~ref_config",
]
LEAN_HF = [*LEAN, "generate_config.rollout_backend=hf"]
PROFILED_STAGES = ("actor_generate", "actor_update", "reference_compute_log_prob")


def profiled_lean(steps: int) -> list[str]:
    """The lean run with mindrl's profiler on its last step (`--profile`): each stage call of
    `PROFILED_STAGES` captured on its own (MindSpeed-RL's `profiler_config.integrated`)."""
    key = "+profiler_config.integrated."
    return [
        *LEAN,
        f"{key}profile=true",
        f"{key}stage=[{','.join(PROFILED_STAGES)}]",
        f"{key}profile_step_start={steps}",
        f"{key}profile_step_end={steps + 1}",
    ]


PHASES = ("rollout", "reward", "log_probs", "update", "sync")


def step_medians(out_dir: Path, warmup: int) -> dict[str, Any]:
    """Medians over the steps after `warmup` of the step, each phase and the wall time between
    metric rows; the first and last step's score."""
    from mindrl.trainer.metrics import merged_step_records

    records = [r for r in merged_step_records(out_dir / "metrics.jsonl") if "timing/step" in r]
    steady = records[warmup:]
    if len(steady) < 2:
        raise ValueError(f"{len(records)} steps recorded: fewer than warmup {warmup} + 2")
    walls = [b["time"] - a["time"] for a, b in zip(steady, steady[1:])]
    phases = {
        p: statistics.median(r[f"timing/{p}"] for r in steady)
        for p in PHASES
        if all(f"timing/{p}" in r for r in steady)
    }
    return {
        "median_step_s": statistics.median(r["timing/step"] for r in steady),
        "median_wall_s": statistics.median(walls),
        "median_phase_s": phases,
        "steps_measured": len(steady),
        "score_first": records[0].get("grpo/score"),
        "score_last": records[-1].get("grpo/score"),
    }


def combine_rounds(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One result per variant from R rounds of runs: the median over its measured rounds of the
    step, wall and each phase, `round_step_s` (every round's step median, in order); its other
    fields (peak memory, scores, command) are those of the round whose step is the lower
    median. A variant that failed in any round carries that round's error, so the bench
    reports the failure rather than a median over the runs that happened to finish."""
    combined: dict[str, dict[str, Any]] = {}
    for name in rounds[0]:
        measured = [r[name] for r in rounds if "median_step_s" in r.get(name, {})]
        errors = [r[name]["error"] for r in rounds if "error" in r.get(name, {})]
        if not measured:
            combined[name] = {"error": errors[0] if errors else "not run"}
            continue
        steps = [r["median_step_s"] for r in measured]
        middle = measured[steps.index(statistics.median_low(steps))]
        phases = {
            p: statistics.median(r["median_phase_s"][p] for r in measured)
            for p in middle["median_phase_s"]
            if all(p in r["median_phase_s"] for r in measured)
        }
        combined[name] = {
            **middle,
            "median_step_s": statistics.median(steps),
            "median_wall_s": statistics.median(r["median_wall_s"] for r in measured),
            "median_phase_s": phases,
            "round_step_s": steps,
            **({"error": errors[0]} if errors else {}),
        }
    return combined


def _step(res: dict[str, Any]) -> str:
    """A variant's step median, and its rounds' range when it ran more than once."""
    rounds = res.get("round_step_s", [])
    spread = f" [{min(rounds):.3f}-{max(rounds):.3f}]" if len(rounds) > 1 else ""
    return f"{res['median_step_s']:.3f}s{spread}"


def summary_line(
    results: dict[str, dict[str, Any]], host_gflops: tuple[float, float] | None = None
) -> str:
    """The last line; `host_gflops`: the fp32 matmul rate before and after the runs, so a
    step time can be read against the host's speed that day (it swings between hosts and
    hours, and the tiny step follows it)."""
    shipped, lean = (results[n]["median_step_s"] for n in ("shipped", "lean"))
    best = min(shipped, lean)
    verdict = "ok" if best <= TARGET_S else "below"
    host = (
        f" (host fp32 matmul {host_gflops[0]:.0f} / {host_gflops[1]:.0f} GFLOP/s before / after)"
        if host_gflops
        else ""
    )
    lean_hf = (
        f"lean_hf={_step(results['lean_hf'])} "
        if "median_step_s" in results.get("lean_hf", {})
        else ""
    )
    return (
        f"tiny_step: shipped={_step(results['shipped'])} lean={_step(results['lean'])} "
        f"(x{lean / shipped:.2f}) "
        f"{lean_hf}wall shipped={results['shipped']['median_wall_s']:.3f}s "
        f"lean={results['lean']['median_wall_s']:.3f}s "
        f"target<={TARGET_S}s {verdict}{host}"
    )


def describe(res: dict[str, Any]) -> str:
    phases = {k: round(v, 3) for k, v in res["median_phase_s"].items()}
    return (
        f"median step {res['median_step_s']:.3f} s, wall {res['median_wall_s']:.3f} s, "
        f"phases {phases}, peak {res['summary']['peak_pss_gib']:.2f} GiB, "
        f"score {res['score_first']:.2f} -> {res['score_last']:.2f}"
    )


def run_profiled(args: argparse.Namespace) -> dict[str, Any]:
    """One lean run of warmup + 2 steps, its last profiled; per stage call the breakdown of
    `tools/bench/trace_summary.py` (a stage called inside another, such as the update's own
    old-policy pass, is in its caller's time too)."""
    from tools.bench.trace_summary import describe_breakdown, folder_breakdown
    from tools.bench.variants import run_variants

    steps = args.warmup + 2
    work = args.work_dir / "profiled" if args.work_dir is not None else None
    result = run_variants(
        "tiny_step",
        CONFIG,
        steps,
        {"lean_profiled": profiled_lean(steps)},
        work,
        args.timeout_s,
        measure=lambda out_dir: {
            "stages": folder_breakdown(out_dir / "profiler_data", PROFILED_STAGES)
        },
        describe=lambda res: f"step {steps} profiled",
    )["lean_profiled"]
    for line in describe_breakdown(result.get("stages", {})):
        print(line, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "tiny_step.json")
    parser.add_argument("--work-dir", type=Path, help="keep the runs' outputs here (else temp)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    parser.add_argument(
        "--hf-rollout", action="store_true", help="also the lean run with the HF rollout backend"
    )
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all the variants")
    parser.add_argument(
        "--pss-every-second",
        action="store_true",
        help="read the tree's PSS every second, as the other benches do (slows this step)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then one lean run with its last step profiled: where each stage call's time "
        "goes (operators, the work between them, the top operators)",
    )
    args = parser.parse_args(argv)
    if args.steps < args.warmup + 2:
        parser.error("--steps must exceed --warmup by at least 2")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    from tools.bench.roofline import matmul_gflops
    from tools.bench.variants import finish, run_variants

    load_start = os.getloadavg()
    rate_before = matmul_gflops("fp32")
    variants = {"shipped": [], "lean": LEAN, **({"lean_hf": LEAN_HF} if args.hf_rollout else {})}
    rounds = []
    for i in range(args.repeats):
        if args.repeats > 1:
            print(f"tiny_step: round {i + 1} of {args.repeats}", flush=True)
        work = args.work_dir
        if work is not None and args.repeats > 1:
            work = work / f"round{i + 1}"  # each round's runs kept apart
        rounds.append(
            run_variants(
                "tiny_step",
                CONFIG,
                args.steps,
                variants,
                work,
                args.timeout_s,
                measure=lambda out_dir: step_medians(out_dir, args.warmup),
                describe=describe,
                pss_gate_mib=None if args.pss_every_second else PSS_GATE_MIB,
            )
        )
    results = combine_rounds(rounds)
    profile = run_profiled(args) if args.profile else None
    rate_after = matmul_gflops("fp32")
    report = {
        "config_name": CONFIG,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "target_s": TARGET_S,
        "lean_overrides": LEAN,
        "lean_hf_overrides": LEAN_HF if args.hf_rollout else None,
        "host_fp32_matmul_gflops": [rate_before, rate_after],
        "memory_reading": (
            "PSS every 1 s"
            if args.pss_every_second
            else f"PSS at each {PSS_GATE_MIB:.0f} MiB of private resident growth"
        ),
        "runs": results,
        "profile": profile,
    }
    rates = (rate_before, rate_after)
    return finish("tiny_step", args.out, report, load_start, lambda runs: summary_line(runs, rates))


if __name__ == "__main__":
    sys.exit(main())
