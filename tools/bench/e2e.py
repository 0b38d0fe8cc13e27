"""Benchmark: end-to-end GRPO tokens/s of mindrl against TRL's GRPOTrainer, same workload.

    python tools/bench/e2e.py [--steps 5] [--config-name grpo_smollm2_cpu] [--bf16]
                              [--skip-trl] [--out bench/results/e2e.json]
                              [--mindrl-override KEY=VALUE ...]

Measures the product: the config as shipped, with no overrides (its precision is the one it
picks on this machine: the SmolLM2 configs' `${cpu_precision:...}`). An override is the
exception; the report prints every run's overrides and records them in the JSON. Runs, one
after the other in this invocation, each in its own process tree:
  mindrl_P  `cli/train_grpo.py --config-name CONFIG` for --steps steps, as shipped; P is the
            precision the config resolved to here (fp32 or bf16)
  trl_P     tools/bench/trl_grpo.py: TRL's GRPOTrainer at that precision (bf16: pure bf16,
            TRL's fastest) on the same model, prompt store, verifier, group size, prompts per
            step, max new tokens, sampling, lr, Adam, clip ratio, KL coefficient and
            micro-batch size, read from the same config (with the --mindrl-override's
            applied); gradient checkpointing on exactly when mindrl recomputes whole layers
            (`recompute_granularity: full`), so without recompute TRL runs at its fastest, not
            its default (checkpointing on)
  with --bf16 both stacks at both precisions: mindrl at the precision it did not ship at
  (pinned by overrides, printed as such: bf16 weights and vLLM with megatron's
  mixed-precision optimizer and fp32 master weights, or fp32), trl_fp32, trl_bf16 (bf16
  weights and Adam state: cheaper, less precise) and trl_bf16_mixed (fp32 weights, bf16
  autocast: megatron's arithmetic). The report names the fastest mindrl run measured (which
  precision is faster depends on the CPU's bf16 matmul hardware).

Per run: wall seconds per step, tokens per step (prompt + response tokens of the step's
samples), the step's mean reward, the time split by phase, and the peak memory (summed PSS)
of the run's whole process tree (Ray workers included), sampled every second. Per mindrl run
also its roofline (tools/bench/roofline.py): each model phase's seconds against the floor its
FLOPs set at the machine's matmul rate for the run's precision (the mean of one measurement
right before the run and one right after: the host's speed drifts; both are reported).
Step 1 is warm-up (engine and allocator caches) for both stacks: s/step and tok/s are over
steps 2..N. A TRL run that fails (TRL not installed, say) is reported with its error (JSON
`failed_runs`, exit code 1) and mindrl's runs still are.

ratio = mindrl_fp32 tok/s / trl_fp32 tok/s (target >= 1.5) where both ran fp32; the bf16 and
bf16_mixed ratios (mindrl_bf16 against each TRL bf16 run) where they ran bf16; fastest_ratio:
mindrl's fastest run against TRL's fastest, whatever their precisions (target >= 3; the last
line). Writes
bench/results/e2e.json and e2e.png (reward curves, s/step, phase split).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.bench.host import host_facts  # noqa: E402
from tools.bench.process_tree import run_tree  # noqa: E402
from tools.bench.roofline import summary_line as roofline_line  # noqa: E402

TARGET = 1.5
FASTEST_TARGET = 3.0  # #18: each stack at its fastest working precision on the machine
MINDRL_PHASES = ("rollout", "reward", "ref", "old_log_prob", "adv", "update", "sync")
# what pins a mindrl run's precision when it is not the one the config ships with (--bf16)
PRECISION_OVERRIDES = {
    "fp32": ("megatron_training.bf16=false", "generate_config.dtype=float32"),
    "bf16": ("megatron_training.bf16=true", "generate_config.dtype=bfloat16"),
}


def mindrl_phases(m: dict[str, float]) -> dict[str, float]:
    """A step's seconds by phase, adding up to at most its wall time: the reference and
    old-policy passes overlap, so their wall time together (`timing/log_probs`) stands for
    both (the roofline still reads each pass's own)."""
    phases = {p: m.get(f"timing/{p}", 0.0) for p in MINDRL_PHASES}
    if "timing/log_probs" in m:
        phases = {p: v for p, v in phases.items() if p not in ("ref", "old_log_prob")}
        phases["log_probs"] = m["timing/log_probs"]
    return phases


def shipped_precision(config: str, overrides: tuple[str, ...] = ()) -> str:
    """The training precision `config` (with `overrides`) resolves to on this machine, as the
    roofline names it: "bf16" or "fp32"."""
    from mindrl.config import load_run_config

    run = load_run_config(config, list(overrides), check_paths=False)[0]
    return "fp32" if run.actor.precision.params_dtype == "fp32" else "bf16"


def mindrl_overrides(
    precision: str, shipped: str, overrides: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """A mindrl run's overrides: the user's, plus the precision pin only where the run's
    precision is not the one the config ships with here."""
    pin = () if precision == shipped else PRECISION_OVERRIDES[precision]
    return (*pin, *overrides)


def overrides_line(name: str, config: str, overrides: list[str] | tuple[str, ...]) -> str:
    """How a run differs from the shipped config: the report's line for it."""
    if not overrides:
        return f"{name}: {config} as shipped (no overrides)"
    return f"{name}: {config} with overrides (not as shipped): {' '.join(overrides)}"


def run_mindrl(
    name: str,
    config: str,
    steps: int,
    precision: str,
    work: Path,
    overrides: tuple[str, ...] = (),
    shipped: str | None = None,
) -> dict:
    """`shipped`: the precision the config resolves to here (None: ask it)."""
    extra = mindrl_overrides(precision, shipped or shipped_precision(config, overrides), overrides)
    out_dir = work / name
    cmd = [
        sys.executable,
        "cli/train_grpo.py",
        "--config-name",
        config,
        f"megatron_training.train_iters={steps}",
        f"runtime.output_dir={out_dir}",
        f"actor_config.save={out_dir / 'ckpt'}",
        "megatron_training.save_interval=0",
        *extra,
    ]
    from tools.bench.roofline import matmul_gflops

    before_gflops = matmul_gflops(precision)  # "fp32" / "bf16", as the roofline names them
    start = time.perf_counter()
    memory = run_tree(cmd, work / f"{name}.log", timeout_s=600 + steps * 300)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    step_rows = []
    for m in rows:
        wall = m["timing/step"]
        phases = mindrl_phases(m)
        phases["other"] = wall - sum(phases.values())
        step_rows.append(
            {
                "step_time": wall,
                "tokens": m["e2e_tps"] * wall,
                "reward": m["grpo/score"],
                "phases": phases,
            }
        )
    return {
        "stack": "mindrl",
        "precision": precision,
        "process_wall_s": time.perf_counter() - start,
        "steps": step_rows,
        "peak_pss_gib": memory.gib,
        "peak_by_process_gib": memory.by_process,
        "overrides": list(extra),
        "roofline": run_roofline(config, cmd[4:], out_dir / "metrics.jsonl", before_gflops),
    }


def run_roofline(
    config: str, overrides: list[str], metrics_path: Path, before_gflops: float
) -> dict:
    """The run's phases against their matmul floor (tools/bench/roofline.py), at this
    machine's matmul rate for the run's precision: the mean of `before_gflops` (measured just
    before the run) and one measured now (the run's tree has exited)."""
    from mindrl.config import load_run_config
    from tools.bench.roofline import measure, step_rows

    run = load_run_config(config, overrides, check_paths=False)[0]
    return measure(run, step_rows(metrics_path), before_gflops)


def run_trl(
    name: str, config: str, steps: int, precision: str, work: Path, overrides: tuple[str, ...] = ()
) -> dict:
    out = work / f"{name}.json"
    cmd = [
        sys.executable,
        "tools/bench/trl_grpo.py",
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--config-name",
        config,
    ]
    if precision != "fp32":
        cmd.append("--" + precision.replace("_", "-"))  # --bf16 / --bf16-mixed
    cmd += ["--", *overrides]  # the mindrl run's workload (recompute included)
    start = time.perf_counter()
    memory = run_tree(cmd, work / f"{name}.log", timeout_s=600 + steps * 400)
    result = json.loads(out.read_text())
    result["process_wall_s"] = time.perf_counter() - start
    result["peak_pss_gib"] = memory.gib  # the tree (TRL's verifier pool included)
    result["peak_by_process_gib"] = memory.by_process
    return result


def summarize(run: dict) -> dict:
    """s/step and tok/s over steps 2..N (step 1 is warm-up), mean phase seconds, rewards."""
    steady = run["steps"][1:] or run["steps"]
    seconds = sum(s["step_time"] for s in steady)
    tokens = sum(s["tokens"] for s in steady)
    phases: dict[str, float] = {}
    for s in steady:
        for k, v in s["phases"].items():
            phases[k] = phases.get(k, 0.0) + v / len(steady)
    rewards = [s.get("reward", float("nan")) for s in run["steps"]]
    return {
        "s_per_step": seconds / len(steady),
        "tok_per_s": tokens / seconds,
        "tokens_per_step": tokens / len(steady),
        "phase_s": {k: round(v, 2) for k, v in phases.items()},
        "rewards": rewards,
        "reward_mean": sum(rewards) / len(rewards),
        "peak_pss_gib": run["peak_pss_gib"],
    }


# ratio name -> (mindrl run, TRL run) at equal precision. megatron's bf16 keeps fp32 master
# weights, so TRL's mixed-precision run is its arithmetic match; TRL's pure-bf16 run is cheaper.
RATIO_PAIRS = {
    "fp32": ("mindrl_fp32", "trl_fp32"),
    "bf16": ("mindrl_bf16", "trl_bf16"),
    "bf16_mixed": ("mindrl_bf16", "trl_bf16_mixed"),
}


def precision_ratios(results: dict[str, dict]) -> dict[str, float]:
    """mindrl tok/s over TRL tok/s for every precision both stacks ran at (equal precision)."""
    ratios = {}
    for precision, (ours_name, theirs_name) in RATIO_PAIRS.items():
        ours, theirs = results.get(ours_name), results.get(theirs_name)
        if ours and theirs:
            ratios[precision] = ours["summary"]["tok_per_s"] / max(
                theirs["summary"]["tok_per_s"], 1e-9
            )
    return ratios


def memory_ratio(results: dict[str, dict]) -> float | None:
    """Peak PSS of mindrl's fastest run over TRL's fastest run's (the issue's comparison:
    each stack at its fastest working setting); None without both stacks."""
    pair = fastest_pair(results)
    if pair is None:
        return None
    ours, theirs = (results[name]["summary"]["peak_pss_gib"] for name in pair)
    return ours / max(theirs, 1e-9)


def fastest_ratio(results: dict[str, dict]) -> float | None:
    """tok/s of mindrl's fastest run over TRL's fastest run's, whatever their precisions
    (the issue's headline: each stack at its fastest working setting on this machine)."""
    pair = fastest_pair(results)
    if pair is None:
        return None
    ours, theirs = (results[name]["summary"]["tok_per_s"] for name in pair)
    return ours / max(theirs, 1e-9)


def fastest_pair(results: dict[str, dict]) -> tuple[str, str] | None:
    """(mindrl's fastest run, TRL's fastest run) by measured tok/s; None without both."""
    if not any(k.startswith("trl_") for k in results):
        return None
    if not any(k.startswith("mindrl_") for k in results):
        return None
    return fastest_mindrl(results), _fastest(results, "trl_")


def fastest_mindrl(results: dict[str, dict]) -> str:
    """The mindrl run with the highest tok/s (measured, not assumed)."""
    return _fastest(results, "mindrl_")


def _fastest(results: dict[str, dict], prefix: str) -> str:
    runs = {k: v for k, v in results.items() if k.startswith(prefix) and v}
    return max(runs, key=lambda k: runs[k]["summary"]["tok_per_s"])


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for name, res in results.items():
        steps = range(1, len(res["steps"]) + 1)
        axes[0].plot(steps, [s.get("reward") for s in res["steps"]], marker="o", label=name)
        axes[1].plot(steps, [s["step_time"] for s in res["steps"]], marker="o", label=name)
    axes[0].set(title="mean reward per step", xlabel="step")
    axes[1].set(title="wall seconds per step", xlabel="step")
    names = list(results)
    phase_names = sorted({p for r in results.values() for p in r["summary"]["phase_s"]})
    bottom = [0.0] * len(names)
    for phase in phase_names:
        values = [results[n]["summary"]["phase_s"].get(phase, 0.0) for n in names]
        axes[2].bar(names, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    axes[2].set(title="seconds per step by phase (steps 2..N)")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_plan(shipped: str, both_precisions: bool, skip_trl: bool) -> list[tuple[str, str]]:
    """(stack, precision) runs in order: mindrl as shipped and TRL at that precision (pure
    bf16 where mindrl ships bf16: TRL's fastest); `both_precisions` adds the rest."""
    plan = [("mindrl", shipped), ("trl", shipped)]
    if both_precisions:
        other = "fp32" if shipped == "bf16" else "bf16"
        plan += [("mindrl", other), ("trl", other), ("trl", "bf16_mixed")]
    return [(stack, p) for stack, p in plan if not (skip_trl and stack == "trl")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--config-name", default="grpo_smollm2_cpu")
    parser.add_argument("--bf16", action="store_true", help="also run both stacks in bf16")
    parser.add_argument("--skip-trl", action="store_true", help="mindrl only (no ratio)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "e2e.json")
    parser.add_argument(
        "--mindrl-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override for every mindrl run and TRL's workload (repeatable; the "
        "runs are then not as shipped, and the report says so), e.g. "
        "actor_config.recompute_granularity=full",
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 is warm-up)")

    overrides = tuple(args.mindrl_override)  # the same workload for both stacks
    shipped = shipped_precision(args.config_name, overrides)
    plan = run_plan(shipped, args.bf16, args.skip_trl)
    print(
        f"e2e: {args.config_name} trains in {shipped} on this machine; "
        + overrides_line("mindrl and TRL", args.config_name, overrides),
        flush=True,
    )
    results: dict[str, dict] = {}
    failures: dict[str, str] = {}  # run name -> why it failed (TRL's runs only)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mindrl-e2e-") as tmp:
        work = Path(tmp)
        for stack, precision in plan:
            name = f"{stack}_{precision}"
            print(f"e2e: running {name} ({args.steps} steps) ...", flush=True)
            if stack == "mindrl":
                res = run_mindrl(
                    name, args.config_name, args.steps, precision, work, overrides, shipped
                )
            else:
                try:
                    res = run_trl(name, args.config_name, args.steps, precision, work, overrides)
                except SystemExit as exc:  # e.g. TRL not installed: mindrl's runs still count
                    print(f"  {name}: FAILED: {exc}", flush=True)
                    failures[name] = str(exc)
                    continue
                res["overrides"] = list(overrides)
            print("  " + overrides_line(name, args.config_name, res["overrides"]), flush=True)
            res["summary"] = summarize(res)
            s = res["summary"]
            print(
                f"  {name}: {s['s_per_step']:.1f} s/step, {s['tok_per_s']:.1f} tok/s, "
                f"peak {s['peak_pss_gib']:.2f} GiB, rewards {[round(r, 3) for r in s['rewards']]}",
                flush=True,
            )
            if "roofline" in res:
                print("  " + roofline_line(name, res["roofline"]), flush=True)
            results[name] = res

    ratios = precision_ratios(results)
    ratio = ratios.get("fp32")
    report = {
        "config_name": args.config_name,
        "steps": args.steps,
        **host_facts(),
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "fastest_mindrl": fastest_mindrl(results),
        "ratio": ratio,
        "ratio_by_precision": ratios,
        "fastest_pair": fastest_pair(results),
        "fastest_ratio": fastest_ratio(results),
        "fastest_target": FASTEST_TARGET,
        "memory_ratio": memory_ratio(results),
        "shipped_precision": shipped,
        "mindrl_overrides": args.mindrl_override,
        "as_shipped": {name: not res["overrides"] for name, res in results.items()},
        "target": TARGET,
        "runs": results,
        "failed_runs": failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    plot(results, args.out.with_suffix(".png"))
    print(f"results: {args.out} and {args.out.with_suffix('.png')}")
    for precision, value in ratios.items():
        if precision != "fp32":
            ours, theirs = RATIO_PAIRS[precision]
            print(f"e2e: {precision} ratio={value:.2f} ({ours} / {theirs})")
    if report["memory_ratio"] is not None:
        print(f"e2e: memory_ratio={report['memory_ratio']:.2f} (peak PSS, fastest against fastest)")
    if args.skip_trl or failures:
        print(f"e2e: ratio=n/a (TRL {'failed: ' + ', '.join(failures) if failures else 'skipped'})")
    elif ratio is not None:
        verdict = "ok" if ratio >= TARGET else "below"
        print(f"e2e: ratio={ratio:.2f} target>={TARGET:.2f} {verdict}")
    if report["fastest_ratio"] is not None:
        ours, theirs = report["fastest_pair"]
        verdict = "ok" if report["fastest_ratio"] >= FASTEST_TARGET else "below"
        print(
            f"e2e: fastest_ratio={report['fastest_ratio']:.2f} ({ours} / {theirs}) "
            f"target>={FASTEST_TARGET:.2f} {verdict}"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
