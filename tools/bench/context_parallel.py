"""Benchmark: one long sequence's forward + backward on megatron-core at CP 1 and CP 2 (and
TP 2 x CP 2 with `--tp2`), over gloo on this CPU; ring attention's keys / values passed round
the ring (`cp2`) and all-gathered (`cp2_gather`).

    python tools/bench/context_parallel.py [--tokens 4096] [--reps 3] [--tp2]
                                           [--config-name grpo_tiny_long_cp2_cpu]
                                           [--out bench/results/context_parallel.json]

Each layout runs in its own set of rank processes (one per rank, one torch thread each): the
config's actor model (random weights), one sequence of `--tokens` tokens, `--reps` timed
forward + backward passes after a warm-up one (the loss: the mean squared logit). Per rank:
seconds per pass (median), the peak of the activations autograd keeps for the backward
(distinct storages, saved-tensor hooks; weights excluded) and the process's peak resident
memory. Writes the JSON; the last line printed is the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# layout: TP, CP, how ring attention's keys / values cross the ring
LAYOUTS = {
    "cp1": (1, 1, "pass"),
    "cp2": (1, 2, "pass"),
    "cp2_gather": (1, 2, "gather"),
    "tp2_cp2": (2, 2, "pass"),
}


def rank_main(args: argparse.Namespace) -> None:
    """One rank: the timed passes; prints its JSON result as the last stdout line."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    from mindrl.config import load_run_config
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.logprobs import causal_attention_mask
    from mindrl.models.parallel import destroy_parallel, init_parallel
    from tools.bench._memory_measure import SavedBytes, live_storages

    torch.set_num_threads(1)
    tp, cp, ring_kv = LAYOUTS[args.layout]
    init_parallel(tp, 1, context_parallel_size=cp, accelerator="cpu")
    run, _ = load_run_config(args.config_name, [])
    arch = run.actor.model
    model = build_gpt_model(arch, context_parallel_algo=args.algo, cp_ring_kv=ring_kv)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, arch.vocab_size, (1, args.tokens), generator=gen)
    positions = torch.arange(args.tokens)[None]
    mask = causal_attention_mask(args.tokens)
    times, peaks = [], []
    for rep in range(args.reps + 1):
        meter = SavedBytes(set(live_storages()))
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            logits = model(tokens, positions, mask)
        logits.float().pow(2).mean().backward()
        if rep:  # the first pass warms up
            times.append(time.perf_counter() - start)
            peaks.append(meter.peak)
        model.zero_grad()
    result = {
        "rank": int(os.environ["RANK"]),
        "seconds": statistics.median(times),
        "saved_activations_mib": max(peaks) / 2**20,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    destroy_parallel()
    print(json.dumps(result), flush=True)


def run_layout(layout: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The layout's ranks as processes; their results in rank order."""
    from mindrl.cluster.calls import free_port

    tp, cp, _ = LAYOUTS[layout]
    world = tp * cp
    port = free_port("127.0.0.1")
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, __file__, "--rank-of", layout, *_passed(args)]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    results = []
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=args.timeout_s)
        if proc.returncode:
            raise SystemExit(f"{layout} rank {rank} exited with {proc.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _passed(args: argparse.Namespace) -> list[str]:
    return [
        f"--tokens={args.tokens}",
        f"--reps={args.reps}",
        f"--config-name={args.config_name}",
        f"--algo={args.algo}",
    ]


def summary(report: dict[str, Any]) -> str:
    parts = []
    for layout, ranks in report["layouts"].items():
        seconds = max(r["seconds"] for r in ranks)
        saved = max(r["saved_activations_mib"] for r in ranks)
        parts.append(f"{layout} {seconds:.2f} s, {saved:.0f} MiB activations/rank")
    return f"context parallel, {report['tokens']} tokens ({report['algo']}): " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tp2", action="store_true", help="also TP 2 x CP 2 (4 processes)")
    parser.add_argument("--config-name", default="grpo_tiny_long_cp2_cpu")
    parser.add_argument("--algo", default="megatron_cp_algo")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "context_parallel.json"))
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--rank-of", choices=sorted(LAYOUTS), dest="layout")
    args = parser.parse_args(argv)
    if args.layout:
        rank_main(args)
        return 0
    layouts = ["cp1", "cp2", "cp2_gather", *(["tp2_cp2"] if args.tp2 else [])]
    report = {
        "tokens": args.tokens,
        "algo": args.algo,
        "config": args.config_name,
        "layouts": {name: run_layout(name, args) for name in layouts},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(summary(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
