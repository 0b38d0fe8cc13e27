"""Benchmark: LoRA against full fine-tuning on grpo_smollm2_cpu, same steps and seed.

    python tools/bench/lora.py [--steps 4] [--rank 16] [--alpha 32] [--lr 1e-4]
                               [--config-name grpo_smollm2_cpu] [--out bench/results/lora.json]
                               [--work-dir DIR]

Runs `cli/train_grpo.py` twice, one after the other, each in a fresh process tree:
  full  the config as shipped (every weight trained, the reference a weight snapshot in the
        actor's processes)
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
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def lora_overrides(rank: int, alpha: int, lr: float) -> list[str]:
    """Adapters on every attention and MLP linear; the reference is the frozen base in the
    actor's processes (the shared backbone, on the integrated worker the config ships with)
    instead of the config's weight snapshot."""
    return [
        f"megatron_training.lora_r={rank}",
        f"megatron_training.lora_alpha={alpha}",
        f"megatron_training.lora_target_modules=[{','.join(LORA_TARGETS)}]",
        f"actor_config.lr={lr}",
        "rl_config.use_integrated_worker=true",
        "rl_config.share_backbone=true",
        "rl_config.reference_in_actor=false",
    ]


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
