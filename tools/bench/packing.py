"""Benchmark: packed, token-budgeted micro-batches against padded ones on grpo_smollm2_cpu.

    python tools/bench/packing.py [--steps 4] [--config-name grpo_smollm2_cpu]
                                  [--ref-tokens 2048] [--update-tokens 1024]
                                  [--out bench/results/packing.json] [--work-dir DIR]
                                  [--shared]

Runs `cli/train_grpo.py` twice (three times with `--shared`), one after the other, each in a
fresh process tree, same seed and data:
  padded  the config with packing off (`PADDED`: micro_batch_size samples per micro-batch,
          padded to the longest; every run's overrides are printed and in the JSON)
  packed  use_remove_padding + use_dynamic_bsz: each pass's micro-batches hold up to its token
          budget, packed into one sequence (the defaults keep about the padded run's tokens
          per micro-batch: 16 x ~100 for the reference, 8 x ~100 for the update)
  shared  (--shared) packed, and the samples of one prompt run it once per micro-batch
          (share_prompt_forward)

Step 1 generates the same samples in both runs (same seed, same weights), so its losses must
agree (packing changes no number beyond float rounding); later steps drift apart as float
noise in the update reaches the sampler. Per run (tools/bench/training_run.py's measurement): seconds
per step over steps 2..N, each phase's mean, peak summed PSS, machine load, and the padding
fraction each pass fed. Writes bench/results/packing.json; the last line is the summary.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.bench.training_run import run_line  # noqa: E402

PADDING_KEYS = (
    "perf/padding_fraction_ref",
    "perf/padding_fraction_actor",
    "perf/padding_fraction_actor_update",
)
STEP1_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "grad_norm", "grpo/score")


# the padded layout (the SmolLM2 configs ship packed): one micro_batch_size per micro-batch
PADDED = (
    "rl_config.use_remove_padding=false",
    "rl_config.use_dynamic_bsz=false",
    "rl_config.share_prompt_forward=false",
)


def packing_overrides(ref_tokens: int, update_tokens: int) -> list[str]:
    return [
        "rl_config.use_remove_padding=true",
        "rl_config.use_dynamic_bsz=true",
        f"rl_config.ref_max_packing_token_size={ref_tokens}",
        f"rl_config.actor_max_packing_token_size={ref_tokens}",
        f"rl_config.update_max_packing_token_size={update_tokens}",
    ]


def step_records(out_dir: Path) -> list[dict[str, Any]]:
    from mindrl.trainer.metrics import merged_step_records

    return [r for r in merged_step_records(out_dir / "metrics.jsonl") if "timing/step" in r]


def padding_and_step1(out_dir: Path) -> dict[str, Any]:
    """The mean padding fraction of each pass over the run, and step 1's losses."""
    records = step_records(out_dir)
    padding = {}
    for key in PADDING_KEYS:
        values = [r[key] for r in records if key in r]
        if values:
            padding[key.removeprefix("perf/padding_fraction_")] = sum(values) / len(values)
    step1 = {k: records[0].get(k) for k in STEP1_KEYS} if records else {}
    return {"padding_fraction": padding, "step1": step1}


def step1_gap(results: dict[str, dict], name: str = "packed") -> dict[str, float]:
    """|`name` - padded| of step 1's losses (the same samples in both runs)."""
    a, b = results["padded"]["step1"], results[name]["step1"]
    return {
        k: abs(a[k] - b[k]) for k in STEP1_KEYS if a.get(k) is not None and b.get(k) is not None
    }


def summary_line(results: dict[str, dict]) -> str:
    padded, packed = results["padded"]["summary"], results["packed"]["summary"]
    t0, t1 = padded["s_per_step"], packed["s_per_step"]
    u0, u1 = (r["phase_s"].get("update", 0.0) for r in (padded, packed))
    r0, r1 = (r["phase_s"].get("ref", 0.0) for r in (padded, packed))
    pad = results["padded"]["padding_fraction"]
    gap = max(step1_gap(results).values(), default=float("nan"))
    return (
        f"packing: step_time padded={t0:.1f}s packed={t1:.1f}s (x{t1 / t0:.2f}) "
        f"update {u0:.1f}s->{u1:.1f}s ref {r0:.1f}s->{r1:.1f}s "
        f"padding padded={pad.get('actor_update', float('nan')):.2f} "
        f"packed={results['packed']['padding_fraction'].get('actor_update', float('nan')):.2f} "
        f"peak_pss padded={padded['peak_pss_gib']:.2f}GiB packed={packed['peak_pss_gib']:.2f}GiB "
        f"step1_max_gap={gap:.2e}"
    ) + (shared_part(results) if "shared" in results else "")


def shared_part(results: dict[str, dict]) -> str:
    """The shared-prompt run against the padded one (`--shared`)."""
    padded, shared = results["padded"]["summary"], results["shared"]["summary"]
    t0, t2 = padded["s_per_step"], shared["s_per_step"]
    gap = max(step1_gap(results, "shared").values(), default=float("nan"))
    return (
        f" | shared={t2:.1f}s (x{t2 / t0:.2f}) update {shared['phase_s'].get('update', 0.0):.1f}s "
        f"ref {shared['phase_s'].get('ref', 0.0):.1f}s peak_pss={shared['peak_pss_gib']:.2f}GiB "
        f"step1_max_gap_shared={gap:.2e}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--config-name", default="grpo_smollm2_cpu")
    parser.add_argument("--ref-tokens", type=int, default=2048, help="reference / old-policy")
    parser.add_argument("--update-tokens", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "packing.json")
    parser.add_argument("--work-dir", type=Path, help="keep the runs' outputs here (else temp)")
    parser.add_argument("--timeout-s", type=float, help="per run (default 900 + 900 x steps)")
    parser.add_argument(
        "--shared",
        action="store_true",
        help="a third run: packed with each prompt once per micro-batch (share_prompt_forward)",
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 is warm-up)")

    from tools.bench.variants import failed, run_variants, write_report

    load_start = os.getloadavg()
    packed = packing_overrides(args.ref_tokens, args.update_tokens)
    variants = {"padded": list(PADDED), "packed": [*packed, "rl_config.share_prompt_forward=false"]}
    if args.shared:
        variants["shared"] = [*packed, "rl_config.share_prompt_forward=true"]
    results = run_variants(
        "packing",
        args.config_name,
        args.steps,
        variants,
        args.work_dir,
        args.timeout_s or 900 + 900 * args.steps,
        measure=padding_and_step1,
        describe=lambda res: f"{run_line(res)}, padding {res['padding_fraction']}",
    )
    report: dict[str, Any] = {
        "config_name": args.config_name,
        "steps": args.steps,
        "budgets": {"ref": args.ref_tokens, "update": args.update_tokens},
        "runs": results,
    }
    if not failed(results):
        report["step1_gap"] = step1_gap(results)
        if args.shared:
            report["step1_gap_shared"] = step1_gap(results, "shared")
    write_report(args.out, report, load_start)
    if "step1_gap" not in report:
        print("packing: failed (see the runs' errors above)")
        return 1
    print(summary_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
