"""Benchmark: the memory plan's predicted per-rank peak against real CPU trainings.

    python tools/bench/memory_plan.py [--steps 3] [--layouts tp1,pp2,...] [--timeout-s 1800]
                                      [--out bench/results/memory_plan.json]

Each layout trains the actor alone (`ActorWorker(run, with_rollout=False)`, no rollout
engine) for --steps updates on a synthetic batch (every sample at the plan's longest
sequence: max_prompt_length + max_tokens, with advantages and reference log-probs), in one
process per rank spawned here (RANK / WORLD_SIZE / MASTER_ADDR=127.0.0.1 / MASTER_PORT, the
CPU workers' allocator settings from `Accelerator.worker_env`). Models: grpo_tiny_cpu widened
(hidden 768, 8 layers, GQA 12/4 heads, 512-token sequences, fp32; random weights) so that
activations and optimizer state are measurable, and SmolLM2-135M (grpo_smollm2_cpu, its real
shape and 49k vocabulary: the loss over the vocabulary; skipped when its offline assets
are missing). Layouts: TP1, TP2, TP2+SP, PP2, PP2+VPP, DP2 with and without the distributed
optimizer, full and selective recompute. A layout that fails to start is reported with its
error and the others still run (features being wired may refuse a layout until they land).

Measured per rank, two ways. The allocated peak: the most bytes torch's tensors held at once
during a step (what `torch.npu/cuda.max_memory_allocated` reports on a device), i.e. the
storages live before the step plus the highest running sum of the profiler's CPU allocation /
free events (tools/bench/_memory_measure.py; also the saved-for-backward peak, and the live
bytes split into params, grads, optimizer state and the rest). The HWM: VmHWM at the end minus
VmRSS just before the model is built (after torch, megatron-core and the process group are up,
so the interpreter's baseline is out); on CPU it also holds the freed activation blocks that
glibc's heap keeps and fragments (the reserved-but-unallocated bytes of a device's caching
allocator), so it grows from step to step above what the tensors hold.
Predicted: the plan's training phase for that rank's pipeline stage (`mindrl.planning`),
without the engine: allocated bytes. The error of a rank is |predicted - measured| / measured;
ratio = 1 - the largest error over every rank of every layout that ran, on the allocated peak
(the HWM ratio is printed on the line before). Writes bench/results/memory_plan.json; the last
line is `memory_plan: ratio=X.XX target>=0.80 ok|below`.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TARGET = 0.80
GIB = float(1 << 30)

WIDE_TINY = (
    "actor_config.load=null",  # random weights: the shipped tiny checkpoint has another shape
    "actor_config.hidden_size=768",
    "actor_config.ffn_hidden_size=2048",
    "actor_config.num_attention_heads=12",
    "actor_config.num_query_groups=4",
    "actor_config.num_layers=8",
    "rl_config.max_prompt_length=64",
    "generate_config.sampling_config.max_tokens=448",
    "generate_config.max_model_len=512",
)
SMOLLM2 = (
    "actor_config.load=null",
    "rl_config.max_prompt_length=64",
    "generate_config.sampling_config.max_tokens=192",
    "generate_config.max_model_len=256",
)
# packing off: micro-batches of micro_batch_size rows (tools/bench/packing.py's)
PADDED = (
    "rl_config.use_remove_padding=false",
    "rl_config.use_dynamic_bsz=false",
    "rl_config.share_prompt_forward=false",
)
RECOMPUTE_FULL = (
    "actor_config.recompute_granularity=full",
    "actor_config.recompute_method=uniform",
    "actor_config.recompute_num_layers=1",
)


@dataclass(frozen=True)
class Layout:
    name: str
    config: str
    world: int
    dp: int
    overrides: tuple[str, ...]

    def all_overrides(self) -> list[str]:
        """The layout's overrides plus the batch that gives each DP rank 2 micro-batches of
        4 samples in one optimizer step (one prompt per rank: the prompts split over the
        rollout engines, one per actor rank), padded (the configs ship packed; the plan is
        checked on the padded micro-batches it counts; grpo_tiny_cpu's reference has its
        own section, grpo_smollm2_cpu's is built from actor_config)."""
        return [
            *self.overrides,
            f"rl_config.actor_resource.num_npus={self.world}",
            f"megatron_training.global_batch_size={self.world}",
            f"rl_config.n_samples_per_prompt={8 * self.dp // self.world}",
            "rl_config.mini_batch_size=0",
            "actor_config.micro_batch_size=4",
            *PADDED,
            *(["ref_config.micro_batch_size=4"] if self.config == "grpo_tiny_cpu" else []),
        ]


def _tiny(name: str, world: int, dp: int, *extra: str) -> Layout:
    return Layout(name, "grpo_tiny_cpu", world, dp, (*WIDE_TINY, *extra))


LAYOUTS: tuple[Layout, ...] = (
    _tiny("tp1", 1, 1),
    _tiny("tp2", 2, 1, "actor_config.tensor_model_parallel_size=2"),
    _tiny(
        "tp2_sp",
        2,
        1,
        "actor_config.tensor_model_parallel_size=2",
        "megatron_training.sequence_parallel=true",
    ),
    _tiny("pp2", 2, 1, "actor_config.pipeline_model_parallel_size=2"),
    _tiny(
        "pp2_vpp",
        2,
        1,
        "actor_config.pipeline_model_parallel_size=2",
        "actor_config.num_layers_per_virtual_pipeline_stage=2",
    ),
    _tiny("dp2", 2, 2, "megatron_training.use_distributed_optimizer=false"),
    _tiny("dp2_distopt", 2, 2, "megatron_training.use_distributed_optimizer=true"),
    _tiny("tp1_recompute", 1, 1, *RECOMPUTE_FULL),
    _tiny("tp1_selective", 1, 1, "actor_config.recompute_granularity=selective"),
    Layout("smollm2_tp1", "grpo_smollm2_cpu", 1, 1, SMOLLM2),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3, help="updates per layout")
    p.add_argument(
        "--layouts",
        default="all",
        help=f"comma-separated subset of: {', '.join(lay.name for lay in LAYOUTS)} (default all)",
    )
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per layout")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "memory_plan.json"))
    p.add_argument("--rank", nargs=2, metavar=("ARGS_JSON", "RESULT_JSON"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.rank is None:
        args.layouts = select_layouts(args.layouts, p)
    return args


def select_layouts(spec: str, p: argparse.ArgumentParser | None = None) -> list[Layout]:
    if spec == "all":
        return list(LAYOUTS)
    by_name = {lay.name: lay for lay in LAYOUTS}
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        message = f"unknown layout(s) {unknown}; choose from {sorted(by_name)}"
        if p is None:
            raise ValueError(message)
        p.error(message)
    return [by_name[n] for n in names]


# -- one rank (a fresh process) ----------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _synthetic_batch(samples: int, prompt: int, response: int, vocab: int, seed: int) -> Any:
    import torch

    from mindrl.data.batch import build_sample_batch

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, vocab, (samples, prompt), generator=g).tolist()
    responses = torch.randint(1, vocab, (samples, response), generator=g).tolist()
    logps = (-torch.rand(samples, response, generator=g) * 3).tolist()
    batch = build_sample_batch(prompts, responses, 0, rollout_log_probs=logps)
    shape = batch.response_mask.shape
    return batch.with_tensors(
        advantages=torch.randn(shape, generator=g) * batch.response_mask,
        ref_log_probs=batch.tensors["rollout_log_probs"] + 0.01 * torch.randn(shape, generator=g),
    )


def run_rank(args: dict[str, Any]) -> dict[str, Any]:
    """One rank: join the world, build the actor, train --steps updates; its memory."""
    import torch

    from mindrl.config import load_run_config
    from mindrl.models.parallel import init_parallel
    from mindrl.workers.actor import ActorWorker
    from tools.bench._memory_measure import measured_step

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["WORLD_SIZE"])))
    run, _ = load_run_config(args["config"], args["overrides"])
    kwargs: dict[str, Any] = {}  # the interleaved pipeline's chunks, once init_parallel has them
    per_chunk = run.actor.parallel.num_layers_per_virtual_pipeline_stage
    if per_chunk and "virtual_pipeline_size" in inspect.signature(init_parallel).parameters:
        kwargs["virtual_pipeline_size"] = run.actor.model.num_layers // (run.actor.pp * per_chunk)
    # the process group and megatron's groups first: the measured delta starts after them
    info = init_parallel(
        run.actor.tp, run.actor.pp, accelerator="cpu", seed=run.actor.data.seed, **kwargs
    )
    before = _status_kib("VmRSS:") * 1024
    worker = ActorWorker(run, with_rollout=False)
    worker.init_model()
    prompt, response = args["prompt"], args["response"]
    samples = run.actor.batch.global_batch_size * run.rl.algorithm.n_samples_per_prompt
    vocab = min(run.actor.model.vocab_size, 400)
    batch = _synthetic_batch(samples // info.dp_size, prompt, response, vocab, 7 + info.dp_rank)
    steps, hwm = [], []
    for step in range(args["steps"]):
        steps.append(measured_step(worker, batch, step))
        hwm.append(_status_kib("VmHWM:") * 1024 - before)
    peak = _status_kib("VmHWM:") * 1024
    return {
        "rank": info.rank,
        "tp_rank": info.tp_rank,
        "pp_rank": info.pp_rank,
        "dp_rank": info.dp_rank,
        "rss_before_model": before,
        "hwm": peak,
        "measured_hwm": peak - before,
        "measured_allocated_peak": max(m["allocated_peak"] for m in steps),
        "hwm_by_step": hwm,
        "steps": steps,
        "step_s": [m["step_s"] for m in steps],
    }


# -- the parent ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def predict(layout: Layout) -> dict[str, Any]:
    """The plan's training-phase bytes per pipeline stage (no engine), and the lengths."""
    from mindrl.config import load_run_config
    from mindrl.planning.phases import build_plan

    run, _ = load_run_config(layout.config, layout.all_overrides())
    plan = build_plan(run, "cpu")
    actor = next(r for r in plan.roles if r.role == "actor")
    stages = []
    for rank in actor.ranks:
        train = rank.phase("train")
        parts = {n: b for n, b in (train.parts if train else ()) if n != "engine"}
        stages.append({"bytes": sum(parts.values()), "parts": parts})
    return {
        "stages": stages,
        "prompt": plan.lengths.prompt,
        "response": plan.lengths.response,
        "layout": actor.layout,
    }


def run_layout(layout: Layout, steps: int, timeout_s: float, work: Path) -> dict[str, Any]:
    """Every rank of one layout; a failure is returned as {"error": ...}, never raised."""
    try:
        pred = predict(layout)
    except Exception as exc:  # e.g. a config key refused until its feature lands
        return {"error": f"config: {exc}".strip()}
    from mindrl.accelerator import Accelerator

    args = {
        "config": layout.config,
        "overrides": layout.all_overrides(),
        "steps": steps,
        "prompt": pred["prompt"],
        "response": pred["response"],
    }
    folder = work / layout.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "args.json").write_text(json.dumps(args))
    port = _free_port()
    procs = []
    for rank in range(layout.world):
        env = {
            **os.environ,
            **Accelerator("cpu").worker_env(),
            "RANK": str(rank),
            "WORLD_SIZE": str(layout.world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": str(REPO),
        }
        cmd = [sys.executable, __file__, "--rank", str(folder / "args.json")]
        cmd.append(str(folder / f"rank{rank}.json"))
        log = open(folder / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log), log))
    deadline = time.monotonic() + timeout_s
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for other, _ in procs:
                other.kill()
            codes.append(-9)
        log.close()
    if any(codes):
        bad = next(r for r, c in enumerate(codes) if c)
        tail = (folder / f"rank{bad}.log").read_text().strip().splitlines()[-12:]
        return {"error": f"rank {bad} exit code {codes[bad]}: " + " | ".join(tail)[-1500:]}
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(layout.world)]
    for r in ranks:
        stage = pred["stages"][r["pp_rank"]]
        r["predicted"] = stage["bytes"]
        r["predicted_parts"] = stage["parts"]
        for kind in ("hwm", "allocated"):
            measured = r["measured_hwm" if kind == "hwm" else "measured_allocated_peak"]
            r[f"error_{kind}"] = abs(r["predicted"] - measured) / max(measured, 1.0)
    return {"layout": pred["layout"], "ranks": ranks}


TRANSIENT = ("activations", "logits", "inputs")  # predicted parts that come and go in a step


def _gib(parts: dict[str, float]) -> str:
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {b / GIB:.2f}" for name, b in ranked)


def parts_line(r: dict[str, Any]) -> str:
    """Which parts dominate: the plan's, and the measured ones at the rank's peak step (the
    state live before it, the step's transient peak and the saved-for-backward share)."""
    pred = r["predicted_parts"]
    top = max(r["steps"], key=lambda m: m["allocated_peak"])
    at = r["steps"].index(top)
    measured = {**top["before"], "transient": top["transient_peak"]}
    transient = sum(pred.get(n, 0.0) for n in TRANSIENT)
    return (
        f"    parts GiB: predicted {_gib(pred)} (transient {transient / GIB:.2f}) | measured "
        f"step {at}: {_gib(measured)} (saved for backward {top['saved_peak'] / GIB:.2f})"
    )


def summarize(
    results: dict[str, dict[str, Any]],
) -> tuple[float | None, float | None, list[str]]:
    """The ratios (1 - the largest relative error over every rank that ran) on the allocated
    peak and on the HWM; the report lines."""
    lines: list[str] = []
    errors: dict[str, list[float]] = {"allocated": [], "hwm": []}
    for name, res in results.items():
        if "error" in res:
            lines.append(f"{name}: did not run: {res['error']}")
            continue
        for r in res["ranks"]:
            for kind, errs in errors.items():
                errs.append(r[f"error_{kind}"])
            lines.append(
                f"{name} ({res['layout']}) rank {r['rank']} (pp {r['pp_rank']}, tp "
                f"{r['tp_rank']}, dp {r['dp_rank']}): predicted {r['predicted'] / GIB:.2f} GiB, "
                f"allocated peak {r['measured_allocated_peak'] / GIB:.2f} GiB (error "
                f"{r['error_allocated']:.0%}), HWM {r['measured_hwm'] / GIB:.2f} GiB (error "
                f"{r['error_hwm']:.0%})"
            )
            lines.append(parts_line(r))
    ratios = [1.0 - max(e) if e else None for e in errors.values()]
    return ratios[0], ratios[1], lines


def summary_line(ratio: float | None) -> str:
    if ratio is None:
        return f"memory_plan: ratio=nan target>={TARGET:.2f} below"
    verdict = "ok" if ratio >= TARGET else "below"
    return f"memory_plan: ratio={ratio:.2f} target>={TARGET:.2f} {verdict}"


def hwm_line(ratio: float | None) -> str:
    value = "nan" if ratio is None else f"{ratio:.2f}"
    return (
        f"memory_plan (VmHWM): ratio={value}, informative: the CPU heap keeps and fragments "
        "freed activation blocks (a device allocator's reserved bytes); the plan and the "
        "ratio below count allocated bytes"
    )


def _smollm2_available() -> str | None:
    """Why SmolLM2's offline assets cannot be used here (None when they can)."""
    try:
        from mindrl.assets.smollm2 import smollm2_dir

        smollm2_dir()
    except Exception as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.rank is not None:
        params = json.loads(Path(args.rank[0]).read_text())
        Path(args.rank[1]).write_text(json.dumps(run_rank(params)))
        return
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mindrl-bench-memory-") as tmp:
        for layout in args.layouts:
            if layout.config == "grpo_smollm2_cpu" and (why := _smollm2_available()):
                results[layout.name] = {"error": f"skipped: SmolLM2 assets unavailable ({why})"}
                print(f"{layout.name}: skipped ({why})", flush=True)
                continue
            start = time.perf_counter()
            results[layout.name] = run_layout(layout, args.steps, args.timeout_s, Path(tmp))
            results[layout.name]["wall_s"] = time.perf_counter() - start
            *_, lines = summarize({layout.name: results[layout.name]})
            print("\n".join(lines), flush=True)
    ratio, ratio_hwm, lines = summarize(results)
    out = {
        "steps": args.steps,
        "target": TARGET,
        "ratio": ratio,  # on the allocated peak
        "ratio_hwm": ratio_hwm,
        "layouts": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print("\n".join(lines))
    print(hwm_line(ratio_hwm))
    print(summary_line(ratio))


if __name__ == "__main__":
    main()
